"""Reading and writing weights as safetensors files.

Reading parses the header itself and checks it against the file before any tensor data
is read, so a file from elsewhere cannot make the reader allocate more than it holds.

Writes are atomic and durable (``tensorcore.atomic.write_atomic``): a crash or an error
part-way leaves any previous file untouched.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Mapping

import numpy as np
from safetensors.numpy import save as _encode

from tensorcore.atomic import write_atomic
from tensorcore.dtypes import bfloat16_dtype

from .files import open_regular

# safetensors' dtype tags -> NumPy dtypes (``safetensors.numpy`` knows no BF16; bfloat16's
# dtype is made when a file holds one: ``_dtype``)
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": "bfloat16",
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_}
FLOAT_TAGS = ("F64", "F32", "F16", "BF16")


def _dtype(tag: str) -> np.dtype:
    """The NumPy dtype of safetensors' dtype tag ``tag`` (one of ``_DTYPES``)."""
    return bfloat16_dtype() if tag == "BF16" else np.dtype(_DTYPES[tag])


def save_file(arrays: Mapping[str, np.ndarray], path: str | os.PathLike) -> None:
    """Write ``arrays`` (name -> host array) to ``path`` atomically."""
    payload = _encode({key: a if a.flags.c_contiguous else np.copy(a, order="C") for key, a in arrays.items()})
    write_atomic(path, payload)


HEADER_LIMIT = 100_000_000  # bytes of JSON header, safetensors' own cap


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a safetensors header describes it: dtype tag, shape, byte range in the file."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


def read_header(f: BinaryIO, path: str) -> dict[str, TensorEntry]:
    """The tensors the header of the open safetensors file ``f`` declares, checked against the
    file before any tensor data is read: a bounded header length, supported dtypes, byte ranges
    that match the shapes and tile the data exactly, and a data length equal to what the file holds."""
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    length = int.from_bytes(f.read(8), "little") if size >= 8 else -1
    if not 0 <= length <= min(HEADER_LIMIT, size - 8):
        raise ValueError(f"load: {path!r} is not a valid safetensors file (header length {length} for a file of "
                         f"{size} bytes; at most {HEADER_LIMIT:,})")
    try:
        header = json.loads(f.read(length))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"load: {path!r} is not a valid safetensors file (its header is not JSON: {exc})") from exc
    if not isinstance(header, dict):
        raise ValueError(f"load: {path!r} is not a valid safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    entries = {name: _entry(name, info, path, 8 + length) for name, info in header.items()}
    cursor = 8 + length
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].start, item[1].end)):
        if entry.start != cursor:
            raise ValueError(f"load: {path!r} is not a valid safetensors file ({name!r} starts at byte {entry.start}, "
                             f"expected {cursor}: tensors must tile the data without gaps or overlaps)")
        cursor = entry.end
    if cursor != size:
        raise ValueError(f"load: {path!r} is not a valid safetensors file (its header declares {cursor - 8 - length:,} "
                         f"bytes of data, the file holds {size - 8 - length:,})")
    return entries


def _entry(name: str, info: Any, path: str, base: int) -> TensorEntry:
    """The header's entry ``info`` for tensor ``name``, checked; offsets made absolute from ``base``."""
    if not isinstance(info, dict):
        raise ValueError(f"load: {path!r} is not a valid safetensors file (entry {name!r} is not an object)")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in _DTYPES:
        raise ValueError(f"load: {path!r} holds {name!r} as {dtype}, which tensorcore "
                         f"does not support; supported: {', '.join(_DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape) \
            or not isinstance(offsets, list) or len(offsets) != 2 \
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in offsets):
        raise ValueError(f"load: {path!r} is not a valid safetensors file (entry {name!r} needs a shape of "
                         f"non-negative ints and two data offsets, got {info!r})")
    nbytes = math.prod(shape) * _dtype(dtype).itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise ValueError(f"load: {path!r} is not a valid safetensors file ({name!r} of shape {tuple(shape)} and "
                         f"dtype {dtype} needs {nbytes:,} bytes, its offsets {offsets} give {offsets[1] - offsets[0]:,})")
    return TensorEntry(dtype, tuple(shape), base + offsets[0], base + offsets[1])


def read_tensor(f: BinaryIO, entry: TensorEntry, name: str, path: str) -> np.ndarray:
    """The array ``entry`` (from ``read_header`` on ``f``) describes, read from ``f``."""
    buffer = bytearray(entry.end - entry.start)
    f.seek(entry.start)
    if f.readinto(buffer) != len(buffer):
        raise ValueError(f"load: {path!r} is not a valid safetensors file (it ended inside {name!r})")
    return np.frombuffer(buffer, dtype=_dtype(entry.dtype)).reshape(entry.shape)


def load_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a safetensors file into host arrays; a file that is not one (or not a regular file) raises ValueError."""
    path = os.fspath(path)
    with open_regular(path, "load") as f:
        return {name: read_tensor(f, entry, name, path) for name, entry in read_header(f, path).items()}
