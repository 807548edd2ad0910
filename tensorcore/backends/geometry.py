"""Where an array's elements lie in memory (NumPy or CuPy arrays alike).

The tracer names memory by byte range, the executors bind views by address, and the
CuPy weight packs ask whether a weight lies in memory a plan only reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def address(a: Any) -> int:
    """The address of an array's first element (NumPy or CuPy)."""
    if isinstance(a, np.ndarray):
        return a.__array_interface__["data"][0]
    return a.data.ptr


def extent(a: Any) -> tuple[int, int]:
    """(lowest byte address, bytes spanned) of an array's elements."""
    start = address(a)
    if a.size == 0:
        return start, 0
    low = sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s > 0)
    return start + low, high - low + a.dtype.itemsize
