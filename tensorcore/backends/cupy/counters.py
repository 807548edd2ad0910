"""Arrival counters: zeroed uint32 arrays, one set per (device, stream), for kernels
whose last block to finish a piece of work does the rest (the merge of the
GroupNorm statistics, groupnorm_stats.cu).  Each such kernel resets the counters it used, so
they are zero again for the next launch (a replayed CUDA graph included) and are set
only once; kernels on one stream run in order, so they never share them at once."""

from __future__ import annotations

import threading
from typing import Any

import cupy
import numpy

_held: dict[tuple[int, int], list[Any]] = {}
_lock = threading.Lock()


def arrival_counters(count: int) -> Any:
    """At least ``count`` zeroed counters of the current (device, stream).  A set that is
    outgrown is kept alive: a captured graph may still use it."""
    key = (cupy.cuda.runtime.getDevice(), cupy.cuda.get_current_stream().ptr)
    held = _held.get(key)
    if held is None or held[-1].size < count:
        with _lock:
            held = _held.setdefault(key, [])
            size = max(count, 2 * held[-1].size if held else 0, 1024)
            held.append(cupy.zeros(size, dtype=numpy.uint32))
    return held[-1]


def clear(stream: int | None = None) -> None:
    """Drop the counters of one stream (a handle), or of every stream."""
    with _lock:
        for key in [k for k in _held if stream is None or k[1] == stream]:
            del _held[key]
