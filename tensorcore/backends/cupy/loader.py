"""Compile the CUDA sources once per process and hand out kernels.

Sources live in ``backends/cuda`` and ``backends/cupy/cuda``.  Each ``.cu`` file holds
one kernel family.  Kernels templated on ``typename T`` alone are instantiated per
storage type through NVRTC name expressions (``softmax_fwd_kernel<float>``); plain
kernels are used as they are; kernels with further template arguments (tile shapes) are
compiled one instantiation at a time, as the host code asks for them, from the list in
``INSTANCE_MODULES``.  Local headers (``#include "name.cuh"``) are pasted into the source
before compiling, so CuPy's on-disk cache (keyed on the source text) sees header edits
too.  CuPy is imported only when a kernel is first requested.
"""

from __future__ import annotations

import functools
import importlib
import re
from pathlib import Path
from typing import Any

from .. import report

CUDA_DIR = Path(__file__).with_name("cuda")
OPTIONS = ("-std=c++17",)
THREADS = 256
BLOCKS_PER_SM = 8

# NumPy dtype name -> the C storage type the kernels are instantiated for.
C_TYPES = {"float32": "float", "float64": "double", "float16": "half_t", "bfloat16": "bf16_t"}

# Sources whose kernels take template arguments beyond the storage type: the module
# (pure Python, importable without CuPy) whose ``instances()`` lists every instantiation
# the host code may ask for, so the CPU CI can compile them all.
INSTANCE_MODULES = {"conv_igemm.cu": "tensorcore.backends.cupy.conv_plan",
                    "conv_halo.cu": "tensorcore.backends.cupy.conv_halo",
                    "flash_attention.cu": "tensorcore.backends.cupy.flash_attention",
                    "flash_attention_bwd.cu": "tensorcore.backends.cupy.flash_attention_bwd"}

# a kernel definition; launch bounds and upper-case attribute macros may sit before the name
_KERNEL = re.compile(r"(template\s*<([^>]*)>\s*)?__global__\s+void\s+"
                     r"(?:(?:__launch_bounds__\s*\([^)]*\)|[A-Z][A-Z0-9_]*)\s+)*([a-z_]\w*)\s*\(")
_STORAGE_TEMPLATE = re.compile(r"\s*typename\s+T\s*")
_INCLUDE = re.compile(r'#include "([\w.]+)"')


def path(filename: str) -> Path:
    """Where a source or header file lives."""
    if not (CUDA_DIR / filename).exists():
        raise FileNotFoundError(f"no CUDA source {filename!r} in {str(CUDA_DIR)!r}")
    return CUDA_DIR / filename


def sources() -> list[str]:
    """The names of every ``.cu`` file."""
    return sorted(p.name for p in CUDA_DIR.glob("*.cu"))


def kernel_names(filename: str) -> list[tuple[str, bool]]:
    """(name, is_templated) of every ``__global__`` kernel in a source file."""
    text = path(filename).read_text()
    return [(m.group(3), m.group(1) is not None) for m in _KERNEL.finditer(text)]


def name_expressions(filename: str, ctype: str | None) -> list[str]:
    """The names to instantiate: kernels templated on the storage type alone for
    ``ctype``, or the plain ones (other templates come from ``explicit_instances``)."""
    found = [(m.group(3), m.group(2)) for m in _KERNEL.finditer(path(filename).read_text())]
    if ctype is None:
        return [name for name, params in found if params is None]
    return [f"{name}<{ctype}>" for name, params in found
            if params is not None and _STORAGE_TEMPLATE.fullmatch(params)]


def explicit_instances(filename: str) -> list[str]:
    """Every instantiation (``name<args>``) of the file's multi-argument templates."""
    module = INSTANCE_MODULES.get(filename)
    return [] if module is None else list(importlib.import_module(module).instances())


def source(filename: str) -> str:
    """The file's text with each local ``#include "x.cuh"`` replaced by the header
    itself (once; later includes of the same header are dropped)."""
    pasted: set[str] = set()

    def paste(match: re.Match) -> str:
        name = match.group(1)
        if name in pasted:
            return ""
        pasted.add(name)
        return _INCLUDE.sub(paste, path(name).read_text().replace("#pragma once", ""))

    return _INCLUDE.sub(paste, path(filename).read_text())


def is_cooperative(filename: str) -> bool:
    """Whether the file's kernels synchronise their whole grid (cooperative groups): they
    must be launched with ``enable_cooperative_groups=True``, all blocks resident."""
    return "<cooperative_groups.h>" in path(filename).read_text()


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


def raw_instance(filename: str, expression: str) -> Any:
    """The ``cupy.RawKernel`` of one explicit instantiation, e.g.
    ``conv_fprop_kernel<float, 1, 128, 128, 32, 2, 2, 3>``, compiled on its own; on
    Hopper for sm_90a, whose architecture-specific instructions (wgmma) such kernels
    may use (they compile them only where ``__CUDA_ARCH_FEAT_SM90_ALL`` is defined)."""
    return _raw_instance(filename, expression, has_wgmma())


@functools.lru_cache(maxsize=None)
def _raw_instance(filename: str, expression: str, sm90a: bool) -> Any:
    import cupy

    options = OPTIONS + (("-arch=sm_90a",) if sm90a else ())
    module = cupy.RawModule(code=source(filename), options=options,
                            name_expressions=[expression])
    return module.get_function(expression)


def sized_instance(filename: str, expression: str, smem: int) -> Any:
    """The ``raw_instance`` of ``expression`` loaded on the current device and allowed
    ``smem`` bytes of dynamic shared memory, called like ``kernel``'s result."""
    return _sized_instance(filename, expression, smem, _current_device())


@functools.lru_cache(maxsize=None)
def _sized_instance(filename: str, expression: str, smem: int, device: int) -> Any:
    raw = raw_instance(filename, expression)
    raw.max_dynamic_shared_size_bytes = smem
    return raw.kernel


@functools.lru_cache(maxsize=None)
def _function(filename: str, name: str, dtype: Any, device: int) -> Any:
    return raw_kernel(filename, name, dtype).kernel  # loaded on the current device


def kernel(filename: str, name: str, dtype: Any = None) -> Any:
    """The kernel ``name`` of ``filename`` for ``dtype``, loaded on the current device
    and called like a RawKernel: ``kernel(...)(grid, block, args)``.  This is the
    ``cupy.cuda.Function`` behind the RawKernel: calling it directly skips the
    RawKernel's per-call device lookup, host time paid on every launch."""
    if report.active:
        report.note_kernel(name if dtype is None else f"{name}<{ctype_of(dtype)}>")
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


def has_wgmma() -> bool:
    """Whether the current device runs Hopper's warpgroup MMA (sm_90a code: compute
    capability 9.0 exactly; later architectures do not run it)."""
    return _has_wgmma(_current_device())


@functools.lru_cache(maxsize=None)
def _has_wgmma(device: int) -> bool:
    return compute_capability() == 90


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
