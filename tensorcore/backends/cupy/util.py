"""Small helpers shared by the CuPy kernel mixins: dtype checks, layout, launch shapes."""

from __future__ import annotations

import math
from typing import Any, Callable

import cupy
import numpy

from ...dtypes import as_dtype
from . import layout, loader

NULL = numpy.uint64(0)  # a null pointer argument for optional kernel inputs
INT32_LIMIT = 2**31 - 1


# dtype objects (not names: ``dtype.name`` builds a string on every call) the templated
# kernels are instantiated for (bfloat16's imports ml_dtypes: the GPU backend pays for it)
_KERNEL_DTYPES = frozenset(as_dtype(name) for name in loader.C_TYPES)


def has_kernels(*arrays: Any) -> bool:
    """True when every argument is a non-empty CuPy array of one dtype our templated
    kernels are instantiated for (and small enough for 32-bit channel arithmetic).
    Called by every op: kept to attribute reads and set lookups."""
    first = arrays[0]
    dtype = first.dtype if type(first) is cupy.ndarray else None
    for a in arrays:
        if type(a) is not cupy.ndarray or a.dtype is not dtype and a.dtype != dtype:
            return False
    return dtype in _KERNEL_DTYPES and 0 < first.size <= INT32_LIMIT


def empty_as(a: Any) -> Any:
    """An uninitialised C-contiguous array with a's shape and dtype.  The ndarray
    constructor: ``cupy.empty_like`` costs an extra Python-level call per op."""
    return cupy.ndarray(a.shape, a.dtype)


def contiguous(a: Any) -> Any:
    """a itself when C-contiguous (no call into CuPy), else a contiguous copy."""
    return a if a.flags.c_contiguous else layout.dense_copy(a)


def dense(a: Any) -> bool:
    """One C-contiguous block with at least one element (a memcpy covers it)."""
    return a.size > 0 and a.flags.c_contiguous


def ptr(a: Any | None) -> Any:
    """The array itself, or a null pointer for an optional argument left out."""
    return NULL if a is None else a


def pack_width(dtype: Any) -> int:
    """Elements per 16-byte pack of an array's (NumPy dtype object) ``dtype``."""
    return 16 // dtype.itemsize


def aligned(*arrays: Any) -> bool:
    """Whether 16-byte pack loads are legal on every (contiguous) array given (a plain
    loop: a generator costs more host time than the check itself)."""
    for a in arrays:
        if a is not None and a.data.ptr % 16:
            return False
    return True


def acc_dtype(dtype: Any) -> Any:
    """The accumulation dtype the kernels use for ``dtype``."""
    return numpy.float64 if numpy.dtype(dtype) == numpy.float64 else numpy.float32


def row_threads(cols: int) -> int:
    """Threads that share one row: a warp up to 1024 columns, a block beyond."""
    if cols <= 1024:
        return 32
    return 256 if cols <= 16384 else 1024


def row_launch(rows: int, cols: int) -> tuple[tuple[int], tuple[int], int]:
    """(grid, block, threads per row) for a row kernel."""
    tpr = row_threads(cols)
    block = max(256, tpr)
    return (math.ceil(rows / (block // tpr)),), (block,), tpr


def as_rows(x: Any) -> tuple[Any, int, int]:
    """x as a contiguous array with (rows, cols) over its last axis."""
    x = contiguous(x)
    cols = x.shape[-1] if x.ndim else 1
    return x, (x.size // cols if cols else 0), cols


class DeviceBuffers:
    """Device buffers the kernels keep between calls (arrival counters, partial sums),
    by purpose; the CuPy backend owns one and its ``empty_cache`` clears it.  A CUDA
    graph captured while using a buffer keeps its address: clear only when no such
    graph will be replayed again (as for any buffer a graph touches)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, Any] = {}

    def take(self, key: tuple, size: int, make: Callable[[int], Any]) -> Any:
        """The buffer under ``key`` if it has at least ``size`` elements, else a new one
        from ``make(size)`` kept in its place."""
        buf = self._buffers.get(key)
        if buf is None or buf.size < size:
            buf = self._buffers[key] = make(size)
        return buf

    def clear(self) -> None:
        self._buffers.clear()

    def forget_stream(self, stream: int) -> None:
        """Drop the buffers kept for one stream (keys ending in its handle)."""
        for key in [k for k in self._buffers if k[-1] == stream]:
            del self._buffers[key]


def zeroed_counters(buffers: DeviceBuffers, count: int) -> Any:
    """A uint32 device array of at least ``count`` counters that are all zero whenever
    a kernel on the current stream starts: the kernels that use them reset what they
    touch before they finish.  One array per (device, stream), grown (freshly zeroed)
    on demand."""
    key = ("counters", cupy.cuda.runtime.getDevice(), cupy.cuda.get_current_stream().ptr)
    return buffers.take(key, count, lambda n: cupy.zeros(max(n, 1024), dtype=cupy.uint32))
