"""diffusers model folders: ``config.json`` + ``diffusion_pytorch_model.safetensors``.

``PretrainedModel`` gives a model ``from_config``, ``from_pretrained`` and
``save_pretrained``.  Weights load under diffusers' own key names; the attention names
of early diffusers checkpoints (``query``, ``key``, ``value``, ``proj_attn``) are
renamed on the way in, as diffusers itself does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, TypeVar

import numpy as np

from layers import Module
from layers.serialization import load_file, save_file
from tensorcore.atomic import write_atomic

from .config import init_kwargs

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
WEIGHTS_INDEX_NAME = WEIGHTS_NAME + ".index.json"
_DEPRECATED_ATTENTION_NAMES = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}

M = TypeVar("M", bound="PretrainedModel")


class PretrainedModel(Module):
    """A Module whose constructor arguments are its config (``@register_to_config``)."""

    config: Any
    diffusers_class: str = ""
    # Config values diffusers assumes for keys a config.json leaves out, where this class's defaults differ.
    diffusers_defaults: Mapping[str, Any] = {}

    @classmethod
    def from_config(cls: type[M], config: Mapping[str, Any], **overrides: Any) -> M:
        """A new model (random weights) from a config mapping; unknown keys warn and are ignored."""
        return cls(**init_kwargs(cls, {**config, **overrides}))

    @classmethod
    def from_pretrained(cls: type[M], path: str | os.PathLike, dtype: Any = None, device: str | None = None) -> M:
        """The model stored in a diffusers folder, in eval mode.

        Weights are cast to ``dtype`` (default float32, so float16/bfloat16 checkpoints
        load into float32; pass ``tc.float16`` to keep them half) and placed on ``device``.
        A missing, extra or mis-shaped weight raises ValueError naming the key.
        """
        folder = Path(path)
        config = read_config(folder / CONFIG_NAME, cls)
        weights = read_weights(folder)
        model = cls.from_config({**cls.diffusers_defaults, **config})
        if dtype is not None or device is not None:
            model.to(device, dtype)
        model.load_state_dict(rename_deprecated_keys(weights, model.state_dict().keys()))
        return model.eval()

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write config.json and the safetensors weights into the folder ``path`` (created if needed).

        Each file is written to a temporary file and renamed into place, weights first.
        """
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        config = {"_class_name": self.diffusers_class, **self.config.to_json_dict()}
        save_file({k: v.numpy() for k, v in self.state_dict().items()}, folder / WEIGHTS_NAME)
        write_atomic(folder / CONFIG_NAME, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())


def read_config(path: Path, cls: type[PretrainedModel]) -> dict[str, Any]:
    """The JSON object in ``path``; a config written for another model class raises ValueError."""
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{cls.__name__}.from_pretrained: no {CONFIG_NAME} in {str(path.parent)!r}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{cls.__name__}.from_pretrained: {str(path)!r} is not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{cls.__name__}.from_pretrained: {str(path)!r} must hold a JSON object")
    name = config.get("_class_name", cls.diffusers_class)
    if name not in (cls.diffusers_class, cls.__name__):
        raise ValueError(f"{cls.__name__}.from_pretrained: {str(path)!r} describes a {name}, not a {cls.diffusers_class}")
    return config


def read_weights(folder: Path, weights_name: str = WEIGHTS_NAME, index_name: str = WEIGHTS_INDEX_NAME) -> dict[str, np.ndarray]:
    """Every array of the folder's safetensors weights (one file, or the shards an index names).

    A folder with pickle ``.bin`` weights only raises ValueError: they are never unpickled.
    """
    single, index = folder / weights_name, folder / index_name
    if single.exists():
        return load_file(single)
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as exc:
            raise ValueError(f"from_pretrained: {str(index)!r} is not a safetensors index ({exc})") from exc
        weights: dict[str, np.ndarray] = {}
        for shard in shards:
            weights.update(load_file(folder / shard))
        return weights
    others = sorted(p.name for p in folder.glob("*.bin")) if folder.is_dir() else []
    if others:
        raise ValueError(f"from_pretrained: {str(folder)!r} holds pickle weights {others}, which are never loaded; "
                         f"convert them to safetensors ({weights_name})")
    raise FileNotFoundError(f"from_pretrained: no {weights_name} in {str(folder)!r}")


def rename_deprecated_keys(weights: dict[str, Any], expected: Any) -> dict[str, Any]:
    """``weights`` with early diffusers attention names (``*.query.weight`` ...) renamed where the model expects the new ones."""
    expected = set(expected)
    renamed = {}
    for key, value in weights.items():
        if key not in expected and key.count(".") >= 2:
            prefix, name, leaf = key.rsplit(".", 2)
            new = f"{prefix}.{_DEPRECATED_ATTENTION_NAMES.get(name, name)}.{leaf}"
            key = new if new in expected else key
        renamed[key] = value
    return renamed
