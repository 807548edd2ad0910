"""The fused LoRA linear on the GPU: two cuBLAS GEMMs, then one epilogue kernel.

``x @ weight_t`` is written by cuBLAS straight into the result and ``xa = x @ lora_a``
into a small [rows, rank] buffer (our capture-safe handle, TF32 as ``matmul`` allows
it); ``cuda/lora.cu`` then adds the bias and ``scale * xa @ lora_b`` in place, the rank
sum inside the kernel.  Three launches where the eager forward makes six.
"""

from __future__ import annotations

from typing import Any

import cupy

from . import cublas, loader
from .linalg import _operand, allow_tf32
from .util import contiguous, has_kernels, ptr
from ..numpy.lora import lora_shapes

LORA = "lora.cu"


def _gemm_into(x2: Any, w: Any, out2: Any) -> None:
    """out2 [m, n] = x2 [m, k] (C-contiguous) @ w [k, n] (any 2-D layout cuBLAS reads)."""
    (m, k), n = x2.shape, out2.shape[1]
    w, trans, ld = _operand(w)
    cublas.gemm(False, trans, m, n, k, x2.data.ptr, k, 0, w.data.ptr, ld, 0, out2.data.ptr, n, m * n, 1,
                out2.dtype, allow_tf32=allow_tf32())


class CupyLoraKernels:
    """``lora_linear`` (see the protocol); dtypes without kernels and empty calls go to
    the reference."""

    def warm_lora_linear(self, dtype: Any) -> None:
        """Compile and load the epilogue kernel for ``dtype`` now: eager code never runs
        it, so compiled replay calls this before its CUDA graph capture begins."""
        if loader.supports(dtype):
            loader.kernel(LORA, "lora_epilogue_kernel", dtype)

    def lora_linear(self, x, weight_t, bias, lora_a, lora_b, scale, out=None):
        m, k, n, r = lora_shapes(x, weight_t, bias, lora_a, lora_b, out)
        arrays = (x, weight_t, lora_a, lora_b) if bias is None else (x, weight_t, lora_a, lora_b, bias)
        if not (has_kernels(*arrays) and cublas.supports(x.dtype)) or min(m, k, n, r) == 0 \
                or not (out is None or out.flags.c_contiguous):
            return super().lora_linear(x, weight_t, bias, lora_a, lora_b, scale, out=out)
        if out is None:
            out = cupy.empty(x.shape[:-1] + (n,), dtype=x.dtype)
        x2, y = contiguous(x).reshape(m, k), out.reshape(m, n)
        xa = cupy.empty((m, r), dtype=x.dtype)
        _gemm_into(x2, weight_t, y)
        _gemm_into(x2, lora_a, xa)
        bias = None if bias is None else contiguous(bias)
        loader.launch(LORA, "lora_epilogue_kernel", x.dtype, m * n,
               (y, ptr(bias), xa, contiguous(lora_b), m, n, r, float(scale)))
        return out
