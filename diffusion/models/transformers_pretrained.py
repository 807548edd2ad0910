"""transformers model folders: ``config.json`` + ``model.safetensors``.

``TransformersPretrained`` gives a model ``from_config``, ``from_pretrained`` and
``save_pretrained`` in the layout transformers writes: the config's keys beside
``architectures`` and ``model_type``, the weights in ``model.safetensors`` (or the shards
``model.safetensors.index.json`` names; ``variant="fp16"`` reads
``model.fp16.safetensors``).  Files are found, opened and checked against the model by
the same code as diffusers folders (``weights``): headers first, data only when all fit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, TypeVar

from layers import Module

from .config import init_kwargs
from .pretrained import CONFIG_NAME, build_from_folder, read_json_object, variant_name, write_folder
from .weights import Found

WEIGHTS_NAME = "model.safetensors"
# Keys transformers writes into every config.json that say nothing about the network.
BOOKKEEPING_KEYS = frozenset({"architectures", "model_type", "transformers_version", "torch_dtype", "dtype"})

M = TypeVar("M", bound="TransformersPretrained")


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
        config = read_transformers_config(Path(path) / CONFIG_NAME, cls)
        return build_from_folder(cls, path, config, WEIGHTS_NAME, variant, dtype, device,
                                 lambda model, found: model.checkpoint_weights(found))

    def checkpoint_weights(self, found: Found) -> Found:
        """The checkpoint's tensors under this model's parameter names (subclasses rename keys)."""
        return found

    def save_pretrained(self, path: str | os.PathLike, variant: str | None = None) -> None:
        """Write config.json and model.safetensors into the folder ``path`` (created if needed), weights
        first; ``variant="fp16"`` names the weights ``model.fp16.safetensors``."""
        weights = {k: v.numpy() for k, v in self.state_dict().items()}
        dtype = next(iter(weights.values())).dtype.name if weights else "float32"
        config = {"architectures": [type(self).__name__], "model_type": self.model_type,
                  **self.config.to_json_dict(), "dtype": dtype}
        write_folder(path, weights, variant_name(WEIGHTS_NAME, variant), config)


def read_transformers_config(path: Path, cls: type[TransformersPretrained]) -> dict[str, Any]:
    """The JSON object in ``path``; a config of another model type or architecture raises ValueError."""
    owner = f"{cls.__name__}.from_pretrained"
    config = read_json_object(path, owner)
    model_type = config.get("model_type", cls.model_type)
    if model_type != cls.model_type:
        raise ValueError(f"{owner}: {str(path)!r} has model_type {model_type!r}, not {cls.model_type!r}")
    architectures = config.get("architectures") or [cls.__name__]
    if not isinstance(architectures, list) or cls.__name__ not in architectures:
        raise ValueError(f"{owner}: {str(path)!r} describes a {architectures!r}, not a {cls.__name__}")
    return config
