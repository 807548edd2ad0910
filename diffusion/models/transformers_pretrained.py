"""transformers model folders: ``config.json`` + ``model.safetensors``.

``TransformersPretrained`` gives a model ``from_config``, ``from_pretrained`` and
``save_pretrained`` in the layout transformers writes: the config's keys beside
``architectures`` and ``model_type``, the weights in ``model.safetensors`` (or the shards
``model.safetensors.index.json`` names; ``variant="fp16"`` reads
``model.fp16.safetensors``).  The weights are read by ``pretrained.read_weights``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, TypeVar

import numpy as np

from layers import Module
from layers.serialization import save_file
from tensorcore.atomic import write_atomic

from .config import init_kwargs
from .pretrained import CONFIG_NAME, read_weights

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = WEIGHTS_NAME + ".index.json"
# Keys transformers writes into every config.json that say nothing about the network.
BOOKKEEPING_KEYS = frozenset({"architectures", "model_type", "transformers_version", "torch_dtype", "dtype"})

M = TypeVar("M", bound="TransformersPretrained")


def variant_name(name: str, variant: str | None) -> str:
    """``model.safetensors`` -> ``model.fp16.safetensors`` (and ``model.safetensors.index.json`` ->
    ``model.safetensors.index.fp16.json``) for ``variant="fp16"``, as transformers names variants."""
    if variant is None:
        return name
    stem, suffix = name.rsplit(".", 1)
    return f"{stem}.{variant}.{suffix}"


class TransformersPretrained(Module):
    """A Module whose constructor arguments are a transformers config (``@register_to_config``)."""

    config: Any
    model_type: str = ""
    # Config keys of older transformers versions that the model no longer reads; they load without a warning.
    retired_keys: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls: type[M], config: Mapping[str, Any], **overrides: Any) -> M:
        """A new model (random weights) from a config mapping; unknown keys warn and are ignored."""
        values = {k: v for k, v in {**config, **overrides}.items() if k not in BOOKKEEPING_KEYS | cls.retired_keys}
        return cls(**init_kwargs(cls, values))

    @classmethod
    def from_pretrained(cls: type[M], path: str | os.PathLike, dtype: Any = None, device: str | None = None,
                        variant: str | None = None) -> M:
        """The model stored in a transformers folder, in eval mode.

        Weights are cast to ``dtype`` (default float32) and placed on ``device``.  A missing,
        extra or mis-shaped weight raises ValueError naming the key, before any is copied.
        """
        folder = Path(path)
        config = read_transformers_config(folder / CONFIG_NAME, cls)
        weights = read_weights(folder, variant_name(WEIGHTS_NAME, variant), variant_name(WEIGHTS_INDEX_NAME, variant))
        model = cls.from_config(config)
        if dtype is not None or device is not None:
            model.to(device, dtype)
        model.load_state_dict(model.checkpoint_weights(weights))
        return model.eval()

    def checkpoint_weights(self, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The checkpoint's arrays under this model's parameter names (subclasses rename keys)."""
        return weights

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write config.json and model.safetensors into the folder ``path`` (created if needed), weights first."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        weights = {k: v.numpy() for k, v in self.state_dict().items()}
        dtype = next(iter(weights.values())).dtype.name if weights else "float32"
        config = {"architectures": [type(self).__name__], "model_type": self.model_type,
                  **self.config.to_json_dict(), "dtype": dtype}
        save_file(weights, folder / WEIGHTS_NAME)
        write_atomic(folder / CONFIG_NAME, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())


def read_transformers_config(path: Path, cls: type[TransformersPretrained]) -> dict[str, Any]:
    """The JSON object in ``path``; a config of another model type or architecture raises ValueError."""
    owner = f"{cls.__name__}.from_pretrained"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{owner}: no {CONFIG_NAME} in {str(path.parent)!r}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{owner}: {str(path)!r} is not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{owner}: {str(path)!r} must hold a JSON object")
    model_type = config.get("model_type", cls.model_type)
    if model_type != cls.model_type:
        raise ValueError(f"{owner}: {str(path)!r} has model_type {model_type!r}, not {cls.model_type!r}")
    architectures = config.get("architectures") or [cls.__name__]
    if not isinstance(architectures, list) or cls.__name__ not in architectures:
        raise ValueError(f"{owner}: {str(path)!r} describes a {architectures!r}, "
                         f"not a {cls.__name__}")
    return config
