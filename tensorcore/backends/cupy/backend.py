"""The CuPy backend: every op on the GPU.

Primitives and the reference fused ops are inherited from the NumPy backend with
``xp = cupy``; the hot kernels, named in ``METHODS`` below, are hand-written
RawKernels (``cuda/*.cu``) and a capture-safe cuBLAS GEMM.  The kernels are
instantiated for bfloat16; calls they hand on to the reference compute bfloat16 in
float32 there (``backends/bfloat16.py``).  No method synchronizes with the
host: results stay on the device until the caller asks.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import cupy

from . import conv_igemm, counters
from .elementwise import CupyElementwiseKernels
from .executor import CudaGraphReplay
from .layout import dense_copy
from .streams import AsyncStream
from .fused import CupyFusedKernels
from .linalg import CupyLinalgKernels
from .lora import CupyLoraKernels
from .nn import CupyNNKernels
from .optim import CupyOptimKernels
from .random import CupyRandomKernels
from .util import DeviceBuffers, dense, zeroed_counters
from ..dispatch import serving
from ..numpy.backend import NumpyBackend


# Which function serves each protocol method the CUDA kernels take over
# (``backends/dispatch.py``); the class body below serves the memory methods, and every
# other method is served as NumpyBackend serves it (with ``xp = cupy``).  A kernel hands
# the calls it does not cover on to NumpyBackend's entry with ``super()``.
METHODS: dict[str, Callable] = {
    "unary": CupyElementwiseKernels.unary,
    "gated_activation": CupyElementwiseKernels.gated_activation,
    "binary": CupyElementwiseKernels.binary,
    "activation_grad": CupyElementwiseKernels.activation_grad,
    "fused_elementwise": CupyFusedKernels.fused_elementwise,
    "reduce": CupyElementwiseKernels.reduce,
    "matmul": CupyLinalgKernels.matmul,
    "matmul_bias_act": CupyLinalgKernels.matmul_bias_act,
    "matmul_bias_act_group": CupyLinalgKernels.matmul_bias_act_group,
    "lora_linear": CupyLoraKernels.lora_linear,
    "conv2d": CupyLinalgKernels.conv2d,
    "group_norm_conv2d": CupyLinalgKernels.group_norm_conv2d,
    "upsample_conv2d": CupyLinalgKernels.upsample_conv2d,
    "conv2d_grad_input": CupyLinalgKernels.conv2d_grad_input,
    "conv2d_grad_weight": CupyLinalgKernels.conv2d_grad_weight,
    "max_pool2d": CupyNNKernels.max_pool2d,
    "max_pool2d_backward": CupyNNKernels.max_pool2d_backward,
    "avg_pool2d": CupyNNKernels.avg_pool2d,
    "avg_pool2d_backward": CupyNNKernels.avg_pool2d_backward,
    "upsample_nearest2d": CupyNNKernels.upsample_nearest2d,
    "upsample_nearest2d_backward": CupyNNKernels.upsample_nearest2d_backward,
    "upsample_bilinear2d": CupyNNKernels.upsample_bilinear2d,
    "upsample_bilinear2d_backward": CupyNNKernels.upsample_bilinear2d_backward,
    "softmax": CupyNNKernels.softmax,
    "softmax_backward": CupyNNKernels.softmax_backward,
    "log_softmax": CupyNNKernels.log_softmax,
    "log_softmax_backward": CupyNNKernels.log_softmax_backward,
    "cross_entropy": CupyNNKernels.cross_entropy,
    "cross_entropy_backward": CupyNNKernels.cross_entropy_backward,
    "layer_norm": CupyNNKernels.layer_norm,
    "layer_norm_backward": CupyNNKernels.layer_norm_backward,
    "group_norm": CupyNNKernels.group_norm,
    "group_norm_backward": CupyNNKernels.group_norm_backward,
    "batch_norm": CupyNNKernels.batch_norm,
    "batch_norm_backward": CupyNNKernels.batch_norm_backward,
    "bias_act": CupyElementwiseKernels.bias_act,
    "bias_act_backward": CupyElementwiseKernels.bias_act_backward,
    "attention": CupyLinalgKernels.attention,
    "attention_backward": CupyLinalgKernels.attention_backward,
    "attention_output": CupyLinalgKernels.attention_output,
    "attention_lse": CupyLinalgKernels.attention_lse,
    "attention_lse_backward": CupyLinalgKernels.attention_lse_backward,
    "embedding_backward": CupyNNKernels.embedding_backward,
    "rng": CupyRandomKernels.rng,
    "uniform": CupyRandomKernels.uniform,
    "normal": CupyRandomKernels.normal,
    "integers": CupyRandomKernels.integers,
    "sgd_update_": CupyOptimKernels.sgd_update_,
    "adam_update_": CupyOptimKernels.adam_update_,
    "rmsprop_update_": CupyOptimKernels.rmsprop_update_,
    "adagrad_update_": CupyOptimKernels.adagrad_update_,
    "lamb_update_": CupyOptimKernels.lamb_update_,
    "lars_update_": CupyOptimKernels.lars_update_,
    "lion_update_": CupyOptimKernels.lion_update_,
}


@serving(METHODS)
class CupyBackend(CupyFusedKernels, CupyElementwiseKernels, CupyLinalgKernels, CupyNNKernels,
                  CupyRandomKernels, CupyOptimKernels, CupyLoraKernels, NumpyBackend):
    """CuPy arrays on the current CUDA device."""

    name = "cupy"
    device = "cuda"
    xp = cupy

    def __init__(self) -> None:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise ImportError("CuPy found no CUDA device")
        self.buffers = DeviceBuffers()

    def empty_cache(self) -> None:
        self.buffers.clear()
        conv_igemm.clear_scratch()

    def kernels_pending(self) -> bool:
        """Never: a CUDA kernel compiles where it is first called."""
        return False

    def release_stream(self, stream: int) -> None:
        self.buffers.forget_stream(stream)
        counters.clear(stream)
        conv_igemm.clear_scratch(stream)

    def executor(self, plan: Any, roots: dict[int, Any], objects: list[Any]) -> CudaGraphReplay:
        """A compiled plan captured as one CUDA graph, launched on the caller's stream."""
        return CudaGraphReplay(plan, self, roots, objects)

    def async_stream(self) -> AsyncStream:
        """A stream of its own for a lane of asynchronous compiled calls."""
        return AsyncStream()

    def reserve_stream(self) -> None:
        """Make the current stream's zeroed counters now: before a CUDA-graph capture on
        a new stream, so that the capture records no memset node zeroing them."""
        zeroed_counters(self.buffers, 1)
        counters.arrival_counters(1)

    def to_numpy(self, a):
        return cupy.asnumpy(a)

    def copy(self, a):
        """A C-contiguous copy: one device-to-device memcpy when ``a`` is C-contiguous
        (a copy kernel's launch costs the host several times more)."""
        if not dense(a):
            return dense_copy(a)
        out = cupy.empty(a.shape, dtype=a.dtype)
        out.data.copy_from_device_async(a.data, a.nbytes)
        return out

    def copy_(self, dst, src) -> None:
        """dst[...] = src, as one memcpy when both are C-contiguous of one shape and dtype,
        as a tiled transpose when only dst is (``layout.dense_copy``)."""
        same = type(src) is cupy.ndarray and src.shape == dst.shape and src.dtype == dst.dtype
        if same and dense(src) and dense(dst):
            dst.data.copy_from_device_async(src.data, src.nbytes)
        elif same and dense(dst):
            dense_copy(src, out=dst)
        else:
            dst[...] = src

    def concatenate(self, arrays, axis, out=None):
        """Dense arrays of one dtype: one 2-D memcpy per array into its slice of the
        result (CuPy's copy kernel indexes the strided slice element by element, at a
        fraction of the copy rate).  Otherwise as the reference, except while a CUDA
        graph is being captured: CuPy joins more than eight arrays through a pointer
        table it uploads from the host, which a capture refuses, so then each array is
        copied into its slice of the result."""
        joined = _join_dense(arrays, axis, out) if arrays and arrays[0].ndim else None
        if joined is not None:
            return joined
        if len(arrays) <= 8 or not cupy.cuda.get_current_stream().is_capturing():
            return super().concatenate(arrays, axis, out=out)
        axis %= arrays[0].ndim
        if out is None:
            shape = list(arrays[0].shape)
            shape[axis] = sum(a.shape[axis] for a in arrays)
            out = cupy.empty(tuple(shape), dtype=cupy.result_type(*arrays))
        index, start = [slice(None)] * out.ndim, 0
        for a in arrays:
            index[axis] = slice(start, start + a.shape[axis])
            out[tuple(index)] = a
            start += a.shape[axis]
        return out


def _join_dense(arrays, axis: int, out):
    """``arrays`` joined along ``axis`` by 2-D memcpys (each array is ``outer`` rows of
    its bytes, the result ``outer`` rows of all of them), or None when an array or
    ``out`` is not dense, the dtypes differ or the shapes do not fit."""
    first = arrays[0]
    axis %= first.ndim
    shape = list(first.shape)
    shape[axis] = sum(a.shape[axis] for a in arrays)
    rest = first.shape[:axis] + first.shape[axis + 1:]
    for a in arrays:
        if type(a) is not cupy.ndarray or a.dtype != first.dtype or not dense(a) \
                or a.shape[:axis] + a.shape[axis + 1:] != rest:
            return None
    if out is None:
        out = cupy.empty(tuple(shape), dtype=first.dtype)
    elif out.dtype != first.dtype or not dense(out) or out.shape != tuple(shape):
        return None
    outer = math.prod(shape[:axis])
    pitch, stream, offset = out.nbytes // outer, cupy.cuda.get_current_stream().ptr, 0
    for a in arrays:
        width = a.nbytes // outer
        cupy.cuda.runtime.memcpy2DAsync(out.data.ptr + offset, pitch, a.data.ptr, width, width, outer,
                                        cupy.cuda.runtime.memcpyDeviceToDevice, stream)
        offset += width
    return out
