"""Compile the CUDA sources in ``backends/cuda`` once per process and hand out kernels.

Each ``.cu`` file holds one kernel family.  Kernels templated on ``typename T`` are
instantiated per storage type through NVRTC name expressions (``softmax_fwd_kernel<float>``);
plain kernels are used as they are.  The shared header ``common.cuh`` is pasted into
the source before compiling, so CuPy's on-disk cache (keyed on the source text) sees
header edits too.  CuPy is imported only when a kernel is first requested.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

CUDA_DIR = Path(__file__).with_name("cuda")
HEADER = "common.cuh"
OPTIONS = ("-std=c++17",)
THREADS = 256
BLOCKS_PER_SM = 8

# NumPy dtype name -> the C storage type the kernels are instantiated for.
C_TYPES = {"float32": "float", "float64": "double", "float16": "half_t", "bfloat16": "bf16_t"}

# a kernel definition; launch bounds and upper-case attribute macros may sit before the name
_KERNEL = re.compile(r"(template\s*<\s*typename\s+T\s*>\s*)?__global__\s+void\s+"
                     r"(?:(?:__launch_bounds__\s*\([^)]*\)|[A-Z][A-Z0-9_]*)\s+)*([a-z_]\w*)\s*\(")


def kernel_names(filename: str) -> list[tuple[str, bool]]:
    """(name, is_templated) of every ``__global__`` kernel in a source file."""
    text = (CUDA_DIR / filename).read_text()
    return [(m.group(2), m.group(1) is not None) for m in _KERNEL.finditer(text)]


def name_expressions(filename: str, ctype: str | None) -> list[str]:
    """The names to instantiate: templated kernels for ``ctype``, or the plain ones."""
    names = kernel_names(filename)
    if ctype is None:
        return [name for name, templated in names if not templated]
    return [f"{name}<{ctype}>" for name, templated in names if templated]


def source(filename: str) -> str:
    """The file's text with ``#include "common.cuh"`` replaced by the header itself."""
    header = (CUDA_DIR / HEADER).read_text().replace("#pragma once", "")
    return (CUDA_DIR / filename).read_text().replace(f'#include "{HEADER}"', header)


def is_cooperative(filename: str) -> bool:
    """Whether the file's kernels synchronise their whole grid (cooperative groups): they
    must be launched with ``enable_cooperative_groups=True``, all blocks resident."""
    return "<cooperative_groups.h>" in (CUDA_DIR / filename).read_text()


@functools.lru_cache(maxsize=None)
def _module(filename: str, ctype: str | None) -> Any:
    import cupy

    return cupy.RawModule(code=source(filename), options=OPTIONS,
                          name_expressions=name_expressions(filename, ctype),
                          enable_cooperative_groups=is_cooperative(filename))


@functools.lru_cache(maxsize=None)
def raw_kernel(filename: str, name: str, dtype: Any = None) -> Any:
    """The ``cupy.RawKernel`` ``name`` of ``filename``, instantiated for ``dtype``
    (a NumPy dtype for templated kernels, ``None`` for plain ones)."""
    if dtype is None:
        return _module(filename, None).get_function(name)
    ctype = ctype_of(dtype)
    return _module(filename, ctype).get_function(f"{name}<{ctype}>")


@functools.lru_cache(maxsize=None)
def _function(filename: str, name: str, dtype: Any, device: int) -> Any:
    return raw_kernel(filename, name, dtype).kernel  # loaded on the current device


def kernel(filename: str, name: str, dtype: Any = None) -> Any:
    """The kernel ``name`` of ``filename`` for ``dtype``, loaded on the current device
    and called like a RawKernel: ``kernel(...)(grid, block, args)``.  This is the
    ``cupy.cuda.Function`` behind the RawKernel: calling it directly skips the
    RawKernel's per-call device lookup (~0.7 us of host time per launch)."""
    return _function(filename, name, dtype, _current_device())


def _current_device() -> int:
    """The current CUDA device's ordinal (binds CuPy's runtime call on first use, so
    importing this module imports no CuPy and a launch runs no import statement)."""
    global _current_device
    import cupy

    _current_device = cupy.cuda.runtime.getDevice
    return _current_device()


def ctype_of(dtype: Any) -> str:
    import numpy

    key = numpy.dtype(dtype).name
    if key not in C_TYPES:
        raise TypeError(f"no CUDA kernel instantiation for dtype {key}; "
                        f"supported: {', '.join(C_TYPES)}")
    return C_TYPES[key]


def supports(dtype: Any) -> bool:
    """Whether the templated kernels are instantiated for ``dtype``."""
    import numpy

    try:
        return numpy.dtype(dtype).name in C_TYPES
    except TypeError:
        return False


@functools.lru_cache(maxsize=None)
def compute_capability() -> int:
    """The current device's compute capability as an int (90 for Hopper)."""
    import cupy

    return int(cupy.cuda.Device().compute_capability)


@functools.lru_cache(maxsize=None)
def sm_count() -> int:
    import cupy

    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


@functools.lru_cache(maxsize=None)
def shared_memory_optin() -> int:
    """The most shared memory (bytes) one block of the current device may opt in to."""
    import cupy

    return int(cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])


_grid_cap = 0  # sm_count() * BLOCKS_PER_SM once known: every launch reads it


def grid_for(work: int, threads: int = THREADS) -> int:
    """Blocks for a grid-stride loop over ``work`` items: enough to cover the work,
    capped at a few blocks per SM.  Plain comparisons: this runs on every launch."""
    global _grid_cap
    if not _grid_cap:
        _grid_cap = sm_count() * BLOCKS_PER_SM
    blocks = (work + threads - 1) // threads
    return 1 if blocks < 1 else blocks if blocks < _grid_cap else _grid_cap


def launch(filename: str, name: str, dtype: Any, work: int, args: tuple,
           threads: int = THREADS) -> None:
    """Launch a 1-D grid-stride kernel over ``work`` items on the current stream."""
    kernel(filename, name, dtype)((grid_for(work, threads),), (threads,), args)
