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
from typing import Any, Callable, Mapping, TypeVar

import numpy as np

import tensorcore as tc
from layers import Module
from layers.files import inside, read_json
from layers.serialization import save_file
from tensorcore.atomic import write_atomic
from tensorcore.devices import canonical

from .config import init_kwargs
from .weights import WEIGHTS_INDEX_NAME, WEIGHTS_NAME, Found, check_weights, open_weights, read_found

CONFIG_NAME = "config.json"
_DEPRECATED_ATTENTION_NAMES = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}

M = TypeVar("M", bound="PretrainedModel")


class PretrainedModel(Module):
    """A Module whose constructor arguments are its config (``@register_to_config``)."""

    config: Any
    diffusers_class: str = ""
    # Config values diffusers assumes for keys a config.json leaves out, where this class's defaults differ.
    diffusers_defaults: Mapping[str, Any] = {}

    @property
    def dtype(self) -> Any:
        """The dtype of the model's weights (its first parameter's, as diffusers reports it)."""
        return next(self.parameters()).dtype

    @property
    def device(self) -> str:
        """The device the model's weights live on (its first parameter's)."""
        return next(self.parameters()).device

    @classmethod
    def from_config(cls: type[M], config: Mapping[str, Any], **overrides: Any) -> M:
        """A new model (random weights) from a config mapping; unknown keys warn and are ignored."""
        return cls(**init_kwargs(cls, {**config, **overrides}))

    @classmethod
    def from_pretrained(cls: type[M], path: str | os.PathLike, dtype: Any = None, device: str | None = None,
                        variant: str | None = None) -> M:
        """The model stored in a diffusers folder, in eval mode.

        Weights are cast to ``dtype`` (default float32, so float16/bfloat16 checkpoints
        load into float32; pass ``tc.float16`` to keep them half) and placed on ``device``.
        ``variant="fp16"`` reads ``diffusion_pytorch_model.fp16.safetensors`` (or its
        sharded index).  A missing, extra or mis-shaped weight raises ValueError naming the key.
        """
        config = read_config(Path(path) / CONFIG_NAME, cls)
        return build_from_folder(cls, path, {**cls.diffusers_defaults, **config}, WEIGHTS_NAME, variant, dtype, device)

    def save_pretrained(self, path: str | os.PathLike, variant: str | None = None) -> None:
        """Write config.json and the safetensors weights into the folder ``path`` (created if needed).

        Each file is written to a temporary file and renamed into place, weights first;
        ``variant="fp16"`` names the weights ``diffusion_pytorch_model.fp16.safetensors``.
        """
        weights = {k: v.numpy() for k, v in self.state_dict().items()}
        config = {"_class_name": self.diffusers_class, **self.config.to_json_dict()}
        write_folder(path, weights, variant_name(WEIGHTS_NAME, variant), config)


def build_from_folder(cls: type, path: str | os.PathLike, config: Mapping[str, Any], weights_name: str,
                      variant: str | None, dtype: Any, device: str | None,
                      rename: Callable[[Module, Found], Found] | None = None) -> Any:
    """``cls.from_config(config)`` cast to ``dtype`` on ``device``, loaded from the folder's
    ``weights_name`` (or its sharded index; ``variant`` inserted in both names), in eval mode,
    its 4-D weights channels-last on the GPU (see ``tensorcore/memory_format.py``).
    ``rename`` maps the checkpoint's key names to the model's (default: early diffusers
    attention names); every header is compared with the model before any data is read."""
    folder = Path(path)
    owner = f"{cls.__name__}.from_pretrained"
    names = variant_name(weights_name, variant), variant_name(weights_name + ".index.json", variant)
    with open_weights(folder, *names, owner) as found:
        model = cls.from_config(config)
        if dtype is not None or device is not None:
            model.to(device, dtype)
        if rename is not None:
            found = rename(model, found)
        load_found(model, folder, found, owner)
    if device is not None and canonical(device) == "cuda":
        model.to(memory_format=tc.channels_last)  # what the GPU's convolutions read, with no packed copy
    return model.eval()


def write_folder(path: str | os.PathLike, weights: Mapping[str, np.ndarray], weights_name: str,
                 config: Mapping[str, Any]) -> None:
    """Write ``weights`` as ``weights_name`` and ``config`` as config.json into the folder
    ``path`` (created if needed), each atomically, weights first."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, folder / weights_name)
    write_atomic(folder / CONFIG_NAME, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())


def variant_name(name: str, variant: str | None) -> str:
    """A weights file name with ``variant`` before its last suffix, as diffusers and transformers name
    variants: ``x.safetensors`` -> ``x.fp16.safetensors``, ``x.safetensors.index.json`` -> ``x.safetensors.index.fp16.json``."""
    if variant is None:
        return name
    stem, suffix = name.rsplit(".", 1)
    return f"{stem}.{variant}.{suffix}"


def read_config(path: Path, cls: type[PretrainedModel]) -> dict[str, Any]:
    """The JSON object in ``path``; a config written for another model class raises ValueError.

    The file must resolve to a regular file inside its folder, of bounded size and nesting.
    """
    owner = f"{cls.__name__}.from_pretrained"
    config = read_json_object(path, owner)
    name = config.get("_class_name", cls.diffusers_class)
    if name not in (cls.diffusers_class, cls.__name__):
        raise ValueError(f"{owner}: {str(path)!r} describes a {name}, not a {cls.diffusers_class}")
    return config


def read_json_object(path: Path, owner: str) -> dict[str, Any]:
    """The JSON object in ``path`` (a config), read only when it resolves to a regular file
    inside its folder, within ``layers.files``' size and nesting caps; ValueError naming
    ``owner`` and the path otherwise, FileNotFoundError when it is missing."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        raise FileNotFoundError(f"{owner}: no {path.name} in {str(path.parent)!r}")
    value = read_json(inside(path.parent, path.name, owner), owner)
    if not isinstance(value, dict):
        raise ValueError(f"{owner}: {str(path)!r} must hold a JSON object")
    return value


def read_weights(folder: Path, weights_name: str = WEIGHTS_NAME, index_name: str | None = None) -> dict[str, np.ndarray]:
    """Every array of the folder's safetensors weights (one file, or the shards an index names;
    ``index_name`` defaults to ``weights_name + ".index.json"``).

    Files must resolve to regular files inside the folder.  A folder with pickle ``.bin``
    weights only raises ValueError: they are never unpickled.  ``load_weights`` also
    compares the headers with a model before reading any data.
    """
    with open_weights(Path(folder), weights_name, index_name) as found:
        return read_found(found)


def load_weights(model: Module, folder: str | os.PathLike, weights_name: str = WEIGHTS_NAME,
                 index_name: str | None = None) -> None:
    """Load the folder's safetensors weights into ``model``, comparing every header with the
    model (names, shapes, float dtypes) before any tensor data is read; any mismatch raises
    ValueError naming the keys and leaves the model untouched."""
    owner = f"{type(model).__name__}.from_pretrained"
    with open_weights(Path(folder), weights_name, index_name, owner) as found:
        load_found(model, Path(folder), found, owner)


def load_found(model: Module, folder: Path, found: Found, owner: str) -> None:
    """Check the open weights ``found`` against ``model`` (early key names renamed), then load them."""
    targets = model.state_dict()
    found = rename_deprecated_keys(found, targets.keys())
    check_weights(owner, folder, targets, found)
    model.load_state_dict(read_found(found))


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
