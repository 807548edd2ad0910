"""The decorators every kernel module uses, so all kernels compile alike.

* ``kernel``: a parallel entry point called from the backend (``prange`` loops).
* ``helper``: a serial function called from kernels (inlined by LLVM).

Fast-math is limited to ``reassoc`` / ``contract`` / ``nsz``: enough for LLVM to
vectorise float reductions and fuse multiply-adds, while inf and NaN keep their IEEE
meaning (softmax masks with -inf, max pooling propagates NaN) and divisions stay
exactly rounded (approximate reciprocals would spoil the tails of sigmoid and tanh).
``error_model="numpy"`` drops the per-division zero check that would otherwise
block vectorisation; ``cache=True`` stores compiled code next to the sources, so
only the first process pays the compile time.
"""

from __future__ import annotations

import numba
from numba import njit

JIT_OPTIONS = {"fastmath": {"reassoc", "contract", "nsz"}, "error_model": "numpy"}

kernel = njit(parallel=True, cache=True, **JIT_OPTIONS)
helper = njit(cache=True, **JIT_OPTIONS)


def thread_count() -> int:
    """Threads in Numba's pool (``NUMBA_NUM_THREADS``, or fewer if set at run time)."""
    return numba.get_num_threads()
