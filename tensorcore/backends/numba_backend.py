"""The Numba backend: the NumPy backend with its hot CPU kernels compiled by Numba.

Overrides activations, bias + activation, the softmax family and cross-entropy,
layer/group/batch norm, convolution, pooling, upsampling, embedding backward and the
optimizer updates with parallel ``@njit`` kernels (``numba_kernels/``); everything
else, and every call in a dtype the kernels do not cover (only float32 and float64
are), runs the NumPy reference.

Start-up: this module imports no Numba; each kernel module is imported on first use
and each kernel compiles on its first call, once per dtype, into Numba's on-disk cache
(``__pycache__`` next to the kernel sources, or ``NUMBA_CACHE_DIR``), so later
processes load machine code instead of compiling.

Threads: creating the backend sets up the CPU thread pools (``numba/threads.py``):
the parallel loops and NumPy's BLAS products share Numba's one pool, sized by
``tc.set_num_threads`` (default: every core, or ``NUMBA_NUM_THREADS``).
"""

from __future__ import annotations

from typing import Any

import numpy

from .bfloat16 import computes_bfloat16_in_float32
from .numba_nn import NumbaNNKernels
from .numba_optim import NumbaOptimKernels
from .numba_spatial import NumbaSpatialKernels
from .numba import threads
from .numpy_backend import NumpyBackend


@computes_bfloat16_in_float32
class NumbaBackend(NumbaNNKernels, NumbaSpatialKernels, NumbaOptimKernels, NumpyBackend):
    """NumPy arrays on the CPU, with Numba kernels for the hot ops."""

    name = "numba"
    device = "cpu"
    xp: Any = numpy

    def __init__(self) -> None:
        threads.configure()  # before any kernel or BLAS call, so the pools never fight
