"""Numba kernels for the CPU backend, one module per family of ops.

The modules hold ``@njit`` functions only; nothing is compiled at import, and the
first call of each kernel compiles it once per dtype (and per activation, for kernels
taking an ``activations.ACT_CODES`` value) and caches the machine code on disk
(``cache=True``), so later processes load it instead of recompiling; a change to any
kernel source clears that cache first (``numba/kernel_cache.py``).  Parallel
loops run on Numba's thread pool, sized by ``NUMBA_NUM_THREADS`` (default: all cores).

``fast_path`` decides whether a call can use these kernels: float32/float64 arrays
of one dtype (other dtypes go to the NumPy reference).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import kernel_cache

kernel_cache.refresh()  # before any kernel loads cached machine code (see kernel_cache.py)

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def fast_path(*arrays: Any) -> bool:
    """True when every non-None array is a NumPy float32 or float64 array and all of
    them share one dtype."""
    dtype = None
    for a in arrays:  # a plain loop: this runs on every call of a Numba method
        if a is None:
            continue
        if not isinstance(a, np.ndarray):
            return False
        if dtype is None:
            dtype = a.dtype
            if dtype not in FLOAT_DTYPES:
                return False
        elif a.dtype != dtype:
            return False
    return dtype is not None
