"""The fused LoRA linear on the CPU: two BLAS products, then one parallel Numba loop."""

from __future__ import annotations

from typing import Any

import numpy as np

from .kernels import fast_path
from ..numpy.lora import lora_shapes

Array = Any


class NumbaLoraKernels:
    """``lora_linear``: ``x @ weight_t`` by BLAS straight into the result, ``x @ lora_a``
    by BLAS, then one loop adds the bias and ``scale * (x @ lora_a) @ lora_b`` in place
    (the rank sum in the loop).  Other dtypes, empty calls and a rank of 0 go to the
    reference."""

    def lora_linear(self, x: Array, weight_t: Array, bias: Array | None, lora_a: Array,
                    lora_b: Array, scale: float, out: Array | None = None) -> Array:
        m, k, n, r = lora_shapes(x, weight_t, bias, lora_a, lora_b, out)
        ready = out is None or out.flags.c_contiguous
        if not (fast_path(x, weight_t, bias, lora_a, lora_b) and ready) or min(m, k, n, r) == 0:
            return super().lora_linear(x, weight_t, bias, lora_a, lora_b, scale, out=out)
        from .kernels.jit import thread_count
        from .kernels.lora import lora_epilogue_

        if out is None:
            out = np.empty(x.shape[:-1] + (n,), dtype=x.dtype)
        x2, y = x.reshape(m, k), out.reshape(m, n)
        np.matmul(x2, weight_t, out=y)
        xa = np.matmul(x2, lora_a)
        b = np.ascontiguousarray(lora_b)
        bias = np.empty(0, x.dtype) if bias is None else np.ascontiguousarray(bias)
        lora_epilogue_(y, bias, bias.size > 0, xa, b, x.dtype.type(scale), min(thread_count(), m))
        return out
