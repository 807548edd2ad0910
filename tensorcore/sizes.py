"""Size checks for everything that allocates a buffer sized by its arguments.

A tensor whose bytes exceed the total memory of the device it is made on can never be
allocated; asking for one is a bug or a hostile input (``scale_factor=1e9``, a shape
from a tampered file).  Such a request raises a ValueError naming the op and the size
*before* anything is allocated, instead of handing the operating system a request its
out-of-memory killer may answer by killing another process.

The bound is the device's total memory (host RAM for ``cpu``), read once per process.
Shapes are multiplied as Python ints, so no product overflows.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Sequence

import numpy as np


@functools.cache
def memory_limit(device: str = "cpu") -> int:
    """Total bytes of memory of ``device`` (host RAM for ``cpu``), read once."""
    if device.startswith("cuda"):
        import cupy

        return int(cupy.cuda.runtime.memGetInfo()[1])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_shape(op: str, shape: Sequence[Any]) -> tuple[int, ...]:
    """``shape`` as a tuple of ints, or a ValueError naming ``op`` for a non-int or negative entry."""
    if any(isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0 for n in shape):
        raise ValueError(f"{op}: shape must be non-negative ints, got {tuple(shape)}")
    return tuple(int(n) for n in shape)


def check_size(op: str, shape: Sequence[int], dtype: Any, device: str = "cpu") -> tuple[int, ...]:
    """``shape`` (checked as ``check_shape`` does), or a ValueError when a ``dtype`` tensor of
    that shape would need more bytes than ``device`` has in all."""
    shape = check_shape(op, shape)
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    limit = memory_limit(device)
    if nbytes > limit:
        raise ValueError(f"{op}: a tensor of shape {shape} and dtype {np.dtype(dtype).name} needs {nbytes:,} bytes, "
                         f"more than the {limit:,} bytes of memory of device {device!r}")
    return shape


def check_factor(op: str, name: str, value: Any) -> float:
    """``value`` as a float when it is a finite positive number, else a ValueError naming ``op`` and ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{op}: {name} must be a positive number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{op}: {name} must be a finite positive number, got {value!r}")
    return float(value)
