"""The Numba backend: the NumPy backend with its hot CPU kernels compiled by Numba.

Overrides activations, bias + activation, the softmax family and cross-entropy,
layer/group/batch norm, convolution, pooling, upsampling, embedding backward and the
optimizer updates with parallel ``@njit`` kernels (``kernels/``); everything
else, and every call in a dtype the kernels do not cover (only float32 and float64
are), runs the NumPy reference; bfloat16 calls of the accumulating ops come back to these
kernels in float32 (``dtypes.ComputesBfloat16InFloat32``).

Start-up: this module imports no Numba; each kernel module is imported on first use
and each kernel compiles on its first call, once per dtype, into Numba's on-disk cache
(``__pycache__`` next to the kernel sources, or ``NUMBA_CACHE_DIR``), so later
processes load machine code instead of compiling.

Threads: creating the backend sets up the CPU thread pools (``numba/threads.py``):
the parallel loops and NumPy's BLAS products share Numba's one pool, sized by
``tc.set_num_threads`` (default: every core, or ``NUMBA_NUM_THREADS``).  It also keeps
glibc's malloc from returning freed arrays to the kernel (``numba/memory.py``), so the
next arrays of a step do not page-fault.
"""

from __future__ import annotations

from typing import Any

import numpy

from . import memory, threads
from .fused import NumbaFusedKernels
from .lora import NumbaLoraKernels
from .nn import NumbaNNKernels
from .optim import NumbaOptimKernels
from .spatial import NumbaSpatialKernels, Scratch
from ..numpy.backend import NumpyBackend


class NumbaBackend(NumbaFusedKernels, NumbaNNKernels, NumbaSpatialKernels, NumbaOptimKernels, NumbaLoraKernels,
                   NumpyBackend):
    """NumPy arrays on the CPU, with Numba kernels for the hot ops."""

    name = "numba"
    device = "cpu"
    xp: Any = numpy

    def __init__(self) -> None:
        threads.configure()  # before any kernel or BLAS call, so the pools never fight
        memory.configure()
        self.scratch = Scratch()

    def empty_cache(self) -> None:
        self.scratch.clear()
