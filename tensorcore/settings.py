"""Every setting tensorcore reads from the environment, read in one place.

``TENSORCORE_BACKEND``   numpy | numba | cupy (default: numba if it imports, else numpy)
``DEBUG``                1 or more: print each op with backend, shapes and time; 2 also
                         the graph and plan of each compiled call
``TENSORCORE_CACHE_DIR`` where ``tc.compile`` keeps plans on disk (default ~/.cache/tensorcore);
                         read when a compiled callable is created
Matmul precision ("highest" | "high") is a runtime setting, as in PyTorch.

Unless the backend is "numpy", importing tensorcore also shortens the busy-wait of idle
BLAS and OpenMP worker threads (``OPENBLAS_THREAD_TIMEOUT=4``, ``GOMP_SPINCOUNT=10000``)
where the environment does not set them: on a few cores, threads spinning after a matrix
product starve the parallel Numba kernel that runs next (an MLP train step on 2 cores ran
4-5x slower).  The NumPy backend keeps the libraries' defaults: its element-wise work is
single-threaded, so a spinning BLAS worker takes no core it needs, and the spin makes the
next matrix product start sooner (MLP SGD step 1.20-1.33x torch instead of 1.37-1.49x).
They are read when NumPy and the OpenMP runtime load, so import tensorcore before NumPy
or torch for them to apply.
"""

from __future__ import annotations

import os

VALID_BACKENDS = ("numpy", "numba", "cupy")
VALID_PRECISIONS = ("highest", "high")

backend_name: str | None = os.environ.get("TENSORCORE_BACKEND") or None
if backend_name != "numpy":
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
debug_level = int(os.environ.get("DEBUG", "0") or 0)
matmul_precision = "highest"


def cache_dir() -> str:
    """The disk cache directory: ``TENSORCORE_CACHE_DIR`` or ``~/.cache/tensorcore``."""
    return os.environ.get("TENSORCORE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tensorcore")


def set_matmul_precision(precision: str) -> None:
    """'highest' keeps float32 GEMM/conv exact; 'high' allows TF32 on the GPU."""
    global matmul_precision
    if precision not in VALID_PRECISIONS:
        raise ValueError(f"set_matmul_precision: expected one of {VALID_PRECISIONS}, got {precision!r}")
    matmul_precision = precision


def get_matmul_precision() -> str:
    return matmul_precision
