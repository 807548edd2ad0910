"""The two decorators every kernel module uses, so all kernels compile alike.

* ``kernel``: a parallel entry point called from the backend (``prange`` loops).
* ``helper``: a serial function called from kernels (inlined by LLVM).
* ``strict_kernel``: a ``kernel`` without fastmath, where NaN must propagate.

``fastmath`` lets LLVM reorder float reductions (needed to vectorise them);
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

# Without fastmath, for kernels whose NaN handling is part of their contract
# (max pooling propagates NaN like PyTorch; fastmath would assume no NaN).
strict_kernel = njit(parallel=True, cache=True, error_model="numpy")


def thread_count() -> int:
    """Threads in Numba's pool (``NUMBA_NUM_THREADS``, or fewer if set at run time)."""
    return numba.get_num_threads()
