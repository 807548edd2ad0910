"""Reading and writing weights as safetensors files.

Writes are atomic: the bytes go to a temporary file in the target's directory, which
is flushed to disk and then renamed over the target, so a crash or an error part-way
leaves any previous file untouched.
"""

from __future__ import annotations

import os
import tempfile
from typing import Mapping

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as _decode
from safetensors.numpy import save as _encode


def save_file(arrays: Mapping[str, np.ndarray], path: str | os.PathLike) -> None:
    """Write ``arrays`` (name -> host array) to ``path`` atomically."""
    path = os.fspath(path)
    payload = _encode({name: a if a.flags.c_contiguous else np.copy(a, order="C") for name, a in arrays.items()})
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a safetensors file into host arrays; a file that is not one raises ValueError."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        payload = f.read()
    try:
        return dict(_decode(payload))
    except (SafetensorError, ValueError, TypeError) as exc:
        raise ValueError(f"load: {path!r} is not a valid safetensors file ({exc})") from exc
