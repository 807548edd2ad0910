"""Reading and writing weights as safetensors files.

Writes are atomic and durable (``tensorcore.atomic.write_atomic``): a crash or an error
part-way leaves any previous file untouched.
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np
from safetensors import SafetensorError, deserialize
from safetensors.numpy import save as _encode

from tensorcore.atomic import write_atomic
from tensorcore.dtypes import bfloat16

# safetensors' dtype tags -> NumPy dtypes (``safetensors.numpy`` knows no BF16)
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": bfloat16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_}


def save_file(arrays: Mapping[str, np.ndarray], path: str | os.PathLike) -> None:
    """Write ``arrays`` (name -> host array) to ``path`` atomically."""
    payload = _encode({key: a if a.flags.c_contiguous else np.copy(a, order="C") for key, a in arrays.items()})
    write_atomic(path, payload)


def load_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a safetensors file into host arrays; a file that is not one raises ValueError."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        payload = f.read()
    try:
        views = deserialize(payload)
    except (SafetensorError, ValueError, TypeError) as exc:
        raise ValueError(f"load: {path!r} is not a valid safetensors file ({exc})") from exc
    arrays = {}
    for name, view in views:
        if view["dtype"] not in _DTYPES:
            raise ValueError(f"load: {path!r} holds {name!r} as {view['dtype']}, which tensorcore "
                             f"does not support; supported: {', '.join(_DTYPES)}")
        arrays[name] = np.frombuffer(view["data"], dtype=_DTYPES[view["dtype"]]).reshape(view["shape"])
    return arrays
