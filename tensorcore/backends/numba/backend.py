"""The Numba backend: the NumPy backend with its hot CPU kernels compiled by Numba.

Overrides activations, bias + activation, the softmax family and cross-entropy,
layer/group/batch norm, convolution, pooling, upsampling, embedding backward and the
optimizer updates with parallel ``@njit`` kernels (``kernels/``); everything
else, and every call in a dtype the kernels do not cover (only float32 and float64
are), runs the NumPy reference; bfloat16 calls of the accumulating ops come back to these
kernels in float32 (``backends/bfloat16.py``).

Start-up: this module imports no Numba; each kernel module is imported on first use
and each kernel compiles on its first call, once per dtype (and per activation, for
kernels that apply one), into Numba's on-disk cache (``__pycache__`` next to the kernel
sources, or ``NUMBA_CACHE_DIR``), so later processes load machine code instead of
compiling; the first compile of a process prints a one-line notice on stderr
(``kernel_cache.announce_compiles``).

Threads: creating the backend sets up the CPU thread pools (``numba/threads.py``):
the parallel loops and NumPy's BLAS products share Numba's one pool, sized by
``tc.set_num_threads`` (default: every core, or ``NUMBA_NUM_THREADS``).  It also keeps
glibc's malloc from returning freed arrays to the kernel (``numba/memory.py``), so the
next arrays of a step do not page-fault.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy

from . import deferral, kernel_cache, memory, threads
from ... import settings
from .attention import NumbaAttentionKernels
from .fused import NumbaFusedKernels
from .lora import NumbaLoraKernels
from .native_forms import NumbaNativeForms
from .nn import NumbaNNKernels
from .optim import NumbaOptimKernels
from .spatial import NumbaSpatialKernels, Scratch
from ..dispatch import serving
from ..numpy.backend import NumpyBackend


# Which function serves each protocol method the Numba kernels take over
# (``backends/dispatch.py``); every other method is served as NumpyBackend serves it.
# A kernel hands the calls it does not cover (other dtypes, layouts) on to NumpyBackend's
# entry with ``super()``; a call whose kernel another process is still compiling runs
# that entry too (``deferral.deferrable``).
METHODS: dict[str, Callable] = {
    "unary": NumbaNNKernels.unary,
    "activation_grad": NumbaNNKernels.activation_grad,
    "fused_elementwise": NumbaFusedKernels.fused_elementwise,
    "reduce": NumbaNNKernels.reduce,
    "matmul_bias_act": NumbaNNKernels.matmul_bias_act,
    "lora_linear": NumbaLoraKernels.lora_linear,
    "conv2d": NumbaSpatialKernels.conv2d,
    "conv2d_grad_input": NumbaSpatialKernels.conv2d_grad_input,
    "conv2d_grad_weight": NumbaSpatialKernels.conv2d_grad_weight,
    "max_pool2d": NumbaSpatialKernels.max_pool2d,
    "max_pool2d_backward": NumbaSpatialKernels.max_pool2d_backward,
    "avg_pool2d": NumbaSpatialKernels.avg_pool2d,
    "avg_pool2d_backward": NumbaSpatialKernels.avg_pool2d_backward,
    "upsample_nearest2d": NumbaSpatialKernels.upsample_nearest2d,
    "upsample_nearest2d_backward": NumbaSpatialKernels.upsample_nearest2d_backward,
    "upsample_bilinear2d": NumbaSpatialKernels.upsample_bilinear2d,
    "upsample_bilinear2d_backward": NumbaSpatialKernels.upsample_bilinear2d_backward,
    "attention": NumbaAttentionKernels.attention,
    "attention_backward": NumbaAttentionKernels.attention_backward,
    "softmax": NumbaNNKernels.softmax,
    "softmax_backward": NumbaNNKernels.softmax_backward,
    "log_softmax": NumbaNNKernels.log_softmax,
    "log_softmax_backward": NumbaNNKernels.log_softmax_backward,
    "cross_entropy": NumbaNNKernels.cross_entropy,
    "cross_entropy_backward": NumbaNNKernels.cross_entropy_backward,
    "cross_entropy_reduced": NumbaNNKernels.cross_entropy_reduced,
    "cross_entropy_reduced_backward": NumbaNNKernels.cross_entropy_reduced_backward,
    "layer_norm": NumbaNNKernels.layer_norm,
    "layer_norm_backward": NumbaNNKernels.layer_norm_backward,
    "group_norm": NumbaNNKernels.group_norm,
    "group_norm_backward": NumbaNNKernels.group_norm_backward,
    "batch_norm": NumbaNNKernels.batch_norm,
    "batch_norm_backward": NumbaNNKernels.batch_norm_backward,
    "bias_act": NumbaNNKernels.bias_act,
    "bias_act_backward": NumbaNNKernels.bias_act_backward,
    "embedding_backward": NumbaNNKernels.embedding_backward,
    "sgd_update_": NumbaOptimKernels.sgd_update_,
    "adam_update_": NumbaOptimKernels.adam_update_,
    "rmsprop_update_": NumbaOptimKernels.rmsprop_update_,
    "adagrad_update_": NumbaOptimKernels.adagrad_update_,
    "lamb_update_": NumbaOptimKernels.lamb_update_,
    "lars_update_": NumbaOptimKernels.lars_update_,
    "lion_update_": NumbaOptimKernels.lion_update_,
}


@serving({name: deferral.deferrable(name, method) for name, method in METHODS.items()})
class NumbaBackend(NumbaNativeForms, NumbaFusedKernels, NumbaNNKernels, NumbaAttentionKernels, NumbaSpatialKernels,
                   NumbaOptimKernels, NumbaLoraKernels, NumpyBackend):
    """NumPy arrays on the CPU, with Numba kernels for the hot ops."""

    name = "numba"
    device = "cpu"
    xp: Any = numpy

    def __init__(self) -> None:
        threads.configure()  # before any kernel or BLAS call, so the pools never fight
        memory.configure()
        kernel_cache.announce_compiles()
        self.scratch = Scratch()

    def empty_cache(self) -> None:
        self.scratch.clear()

    def kernels_pending(self) -> bool:
        return deferral.pending()

    def prepare(self, op: str, args: tuple, kwargs: dict, out: Any) -> Callable[[], Any] | None:
        """A call bound for compiled replay: a fused program's generated loop, an
        activation kernel, else what the NumPy reference binds."""
        return (self._bind_fused_program(op, args, kwargs, out) or self._bind_activation(op, args, kwargs, out)
                or NumpyBackend.prepare(self, op, args, kwargs, out))

    def link(self, steps: list[tuple[Callable[[], Any], Any]],
             install: Callable[[tuple[Callable[[], Any], ...]], None]) -> None:
        """``install`` the calls a compiled plan's replay makes, given its bound steps
        ((Python call, ``native`` form or None) each): runs of native forms as one jitted
        call each, now or once compiled (``native_plan.link``); nothing to install while
        TENSORCORE_NATIVE_PLANS=0 (the Python steps run)."""
        from . import native_plan

        if settings.native_plans():
            native_plan.link(steps, install)
