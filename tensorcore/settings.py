"""Every setting tensorcore reads from the environment, read in one place.

``TENSORCORE_BACKEND``   numpy | numba | cupy (default: numba if it imports, else numpy)
``DEBUG``                1 or more: print each op with backend, shapes and time; 2 also
                         every backend call with the function and kernels that ran
                         (``backends/report.py``, for backends created from then on), the
                         graph and plan of each compiled call and each generated kernel
``TENSORCORE_CACHE_DIR`` where ``tc.compile`` keeps plans and generated Numba kernels on disk
                         (default ~/.cache/tensorcore); read when a compiled callable is
                         created or a kernel generated
``TENSORCORE_NATIVE_PLANS`` 0: compiled plans on the Numba backend replay step by step in
                         Python instead of as generated jitted segments
                         (``backends/numba/native_plan.py``); read when a plan is bound
``TENSORCORE_COMPILE_PROCESSES`` processes that compile the CPU kernels of a cold cache
                         while ``python -m diffusion train`` runs on without them
                         (``backends/numba/warmup.py``; default one per core but one, 2
                         to 4); 0: the run compiles them itself and waits, so a cold run
                         computes what a warm one does, bit for bit
``TENSORCORE_CACHE_KEY_FILE`` the key that signs the compile cache's plan files (default
                         ``$XDG_CONFIG_HOME/tensorcore/cache.key``, else
                         ``~/.config/tensorcore/cache.key``); made on first use, mode 0600
Matmul precision ("highest" | "high") is a runtime setting, as in PyTorch, and so is the
CPU thread count (``tc.set_num_threads``, owned by the Numba backend's
``backends/numba/threads.py``, which also sizes the BLAS): thread pools are set up at run
time, so they work whatever was imported first.
"""

from __future__ import annotations

import os

VALID_BACKENDS = ("numpy", "numba", "cupy")
VALID_PRECISIONS = ("highest", "high")

backend_name: str | None = os.environ.get("TENSORCORE_BACKEND") or None
debug_level = int(os.environ.get("DEBUG", "0") or 0)
matmul_precision = "highest"


def cache_dir() -> str:
    """The disk cache directory: ``TENSORCORE_CACHE_DIR`` or ``~/.cache/tensorcore``."""
    return os.environ.get("TENSORCORE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tensorcore")


def native_plans() -> bool:
    """Whether the Numba backend binds compiled plans as native segments (TENSORCORE_NATIVE_PLANS)."""
    return os.environ.get("TENSORCORE_NATIVE_PLANS", "1") != "0"


def compile_processes() -> int | None:
    """``TENSORCORE_COMPILE_PROCESSES`` as a count, None when unset."""
    value = os.environ.get("TENSORCORE_COMPILE_PROCESSES", "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"TENSORCORE_COMPILE_PROCESSES must be a whole number of processes (0 or more), "
                         f"got {value!r}")
    return int(value)


def cache_key_file() -> str:
    """The file holding the key that signs cached plans: ``TENSORCORE_CACHE_KEY_FILE``, or
    ``cache.key`` in the user's config directory (never in the cache it signs)."""
    explicit = os.environ.get("TENSORCORE_CACHE_KEY_FILE")
    if explicit:
        return explicit
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(config, "tensorcore", "cache.key")


def set_matmul_precision(precision: str) -> None:
    """'highest' keeps float32 GEMM/conv exact; 'high' allows TF32 on the GPU."""
    global matmul_precision
    if precision not in VALID_PRECISIONS:
        raise ValueError(f"set_matmul_precision: expected one of {VALID_PRECISIONS}, got {precision!r}")
    matmul_precision = precision


def get_matmul_precision() -> str:
    return matmul_precision
