"""Where LoRA weights come from: a safetensors file, a folder holding one, or a dict of arrays.

Files are read as safetensors only; a pickled ``.bin`` / ``.pt`` / ``.ckpt`` is refused,
never unpickled.  The header's ``lora_adapter_metadata`` (diffusers' record of the PEFT
settings) comes back beside the arrays.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from layers.files import inside, open_regular
from layers.serialization import read_header, read_tensor
from tensorcore import Tensor
from tensorcore.dtypes import is_bfloat16

from .metadata import METADATA_KEY, OP

WEIGHTS_NAME = "pytorch_lora_weights.safetensors"  # the file a diffusers LoRA folder holds

Source = str | os.PathLike | Mapping[str, Any]


def read_lora(source: Source, weight_name: str | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any] | None]:
    """(name -> array, adapter metadata or None) from ``source``: a dict of arrays (or tensors),
    a ``.safetensors`` file, or a folder holding ``weight_name`` (default ``WEIGHTS_NAME``)."""
    if isinstance(source, Mapping):
        return _arrays(source), None
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"{OP}: expected a path or a dict of arrays, got {type(source).__name__}")
    path = os.fspath(source)
    if os.path.isdir(path):
        path = inside(path, weight_name or WEIGHTS_NAME, OP)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{OP}: {os.fspath(source)!r} holds no {weight_name or WEIGHTS_NAME!r}")
    elif weight_name is not None:
        raise ValueError(f"{OP}: weight_name names a file inside a folder; {path!r} is not a folder")
    if not path.endswith(".safetensors"):
        raise ValueError(f"{OP}: {path!r} is not a .safetensors file; LoRA weights load from safetensors only "
                         "(pickled .bin / .pt / .ckpt files are never unpickled)")
    return _read_safetensors(path)


def _arrays(state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
    arrays = {}
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise TypeError(f"{OP}: keys of a LoRA state dict must be str, got {key!r}")
        array = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
        if array.dtype.kind not in "biuf" and not is_bfloat16(array.dtype):
            raise TypeError(f"{OP}: {key!r} holds {array.dtype} values; LoRA weights are numbers")
        arrays[key] = array
    return arrays


def _read_safetensors(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any] | None]:
    """The arrays of a safetensors file (header checked before any data is read) and its adapter metadata."""
    with open_regular(path, OP) as f:
        entries = read_header(f, path)
        f.seek(0)
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))  # valid: read_header parsed it
        arrays = {name: read_tensor(f, entry, name, path) for name, entry in entries.items()}
    return arrays, _adapter_metadata(header.get("__metadata__"), path)


def _adapter_metadata(metadata: Any, path: str) -> dict[str, Any] | None:
    raw = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    if raw is None:
        return None
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{OP}: {path!r}: the header's {METADATA_KEY} is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{OP}: {path!r}: the header's {METADATA_KEY} must be a JSON object")
    return value
