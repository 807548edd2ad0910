"""``tc.cuda``: device queries and the memory pools of the CuPy backend.

CuPy is imported only when one of these is called, so CPU-only installs never load it.
"""

from __future__ import annotations


def is_available() -> bool:
    """Whether CuPy imports and sees at least one CUDA device."""
    return device_count() > 0


def device_count() -> int:
    """How many CUDA devices CuPy sees (0 without CuPy or a driver)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy, no driver, or no device
        return 0


def memory_allocated() -> int:
    """Bytes held by live arrays: CuPy's default memory pool, and the pools of compiled
    plans and their packed weights."""
    return int(sum(pool.used_bytes() for pool in _pools()))


def memory_reserved() -> int:
    """Bytes those pools hold from the driver (live arrays plus cached free blocks)."""
    return int(sum(pool.total_bytes() for pool in _pools()))


def _pools() -> list:
    import cupy

    from .backends.cupy.pools import private_pools

    return [cupy.get_default_memory_pool(), *private_pools()]


def empty_cache() -> None:
    """Free the buffers the CuPy backend keeps between calls, then return the pool's
    cached free blocks (device and pinned host) to the driver.  Like any buffer, those
    the backend kept must not be freed under a CUDA graph that will still replay."""
    import cupy

    from .backends import created

    backend = created("cupy")
    if backend is not None:
        backend.empty_cache()
    release_cached_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()


def release_cached_blocks() -> None:
    """Return the default pool's cached free blocks to the driver, keeping the buffers
    the backend holds (unlike ``empty_cache``, safe while CUDA graphs may replay)."""
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()


def synchronize() -> None:
    """Wait for all work queued on the current device."""
    import cupy

    cupy.cuda.Device().synchronize()


def conv_stats() -> dict[str, dict[str, int]]:
    """How GPU convolutions ran since the last reset: ``{"implicit_gemm": {pass: count},
    "fallback": {"pass: reason": count}}`` with pass "forward", "input_grad" or
    "weight_grad".  A fallback runs the slower im2col + GEMM path (groups > 1, float64,
    CPU arrays, ...)."""
    from .backends.cupy import conv_plan

    return conv_plan.stats()


def reset_conv_stats() -> None:
    """Zero the counters of ``conv_stats``."""
    from .backends.cupy import conv_plan

    conv_plan.reset_stats()
