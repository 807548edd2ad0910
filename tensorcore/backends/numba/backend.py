"""The Numba backend: the NumPy backend with its hot CPU kernels compiled by Numba.

Overrides activations, bias + activation, the softmax family and cross-entropy,
layer/group/batch norm, convolution, pooling, upsampling, embedding backward and the
optimizer updates with parallel ``@njit`` kernels (``kernels/``); everything
else, and every call in a dtype the kernels do not cover (only float32 and float64
are), runs the NumPy reference.

Start-up: this module imports no Numba; each kernel module is imported on first use
and each kernel compiles on its first call, once per dtype, into Numba's on-disk cache
(``__pycache__`` next to the kernel sources, or ``NUMBA_CACHE_DIR``), so later
processes load machine code instead of compiling.

Threads: the parallel loops run on Numba's pool, sized by ``NUMBA_NUM_THREADS``
(default: every core); ``numba.set_num_threads(n)`` lowers it at run time.  The
matrix products go to NumPy's BLAS, which has its own thread setting
(``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS``).  Kernels and BLAS calls alternate
all the time, so idle threads must not spin long: ``tensorcore.settings`` shortens
both waits at import.
"""

from __future__ import annotations

from typing import Any

import numpy

from ..bfloat16 import computes_bfloat16_in_float32
from .nn import NumbaNNKernels
from .optim import NumbaOptimKernels
from .spatial import NumbaSpatialKernels
from ..numpy.backend import NumpyBackend


@computes_bfloat16_in_float32
class NumbaBackend(NumbaNNKernels, NumbaSpatialKernels, NumbaOptimKernels, NumpyBackend):
    """NumPy arrays on the CPU, with Numba kernels for the hot ops."""

    name = "numba"
    device = "cpu"
    xp: Any = numpy
