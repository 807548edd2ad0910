"""A Linear layer with a low-rank (LoRA) update as one call: the reference.

``lora_linear`` is what the compiled LoRA rewrite (``compile/passes/lora.py``) puts in
place of a LoRALinear's forward; eager code never calls it.  The reference runs the
forward's own steps in the forward's order, so its result is the eager one.
"""

from __future__ import annotations

import math
from typing import Any

from ...dtypes import is_floating

Array = Any


def lora_shapes(x: Array, weight_t: Array, bias: Array | None, lora_a: Array,
                lora_b: Array, out: Array | None = None) -> tuple[int, int, int, int]:
    """(rows, in, out, rank) of a ``lora_linear`` call, x seen as [rows, in]; raises a
    ValueError / TypeError naming the shapes or dtypes that do not fit (``out``: the
    array to write the result into, if any)."""
    arrays = [x, weight_t, lora_a, lora_b] + ([] if bias is None else [bias])
    if any(a.dtype != x.dtype for a in arrays) or not is_floating(x.dtype):
        raise TypeError(f"lora_linear: x, weight_t, bias, lora_a and lora_b must share one float dtype, "
                        f"got {[a.dtype.name for a in arrays]}")
    fits = (x.ndim >= 1 and weight_t.ndim == lora_a.ndim == lora_b.ndim == 2
            and weight_t.shape[0] == lora_a.shape[0] == x.shape[-1]
            and lora_b.shape == (lora_a.shape[1], weight_t.shape[1])
            and (bias is None or tuple(bias.shape) == (weight_t.shape[1],)))
    if not fits:
        raise ValueError(f"lora_linear: expected x [..., in], weight_t [in, out], bias [out], lora_a [in, rank], "
                         f"lora_b [rank, out]; got x {tuple(x.shape)}, weight_t {tuple(weight_t.shape)}, "
                         f"bias {None if bias is None else tuple(bias.shape)}, lora_a {tuple(lora_a.shape)}, "
                         f"lora_b {tuple(lora_b.shape)}")
    k, n = weight_t.shape
    if out is not None and (tuple(out.shape) != tuple(x.shape[:-1]) + (n,) or out.dtype != x.dtype):
        raise ValueError(f"lora_linear: out must be a {x.dtype.name} array of shape {tuple(x.shape[:-1]) + (n,)}, "
                         f"got {out.dtype.name} {tuple(out.shape)}")
    return math.prod(x.shape[:-1]), k, n, lora_a.shape[1]


class NumpyLoraKernels:
    """``lora_linear`` for any NumPy-like ``xp``."""

    xp: Any

    def lora_linear(self, x: Array, weight_t: Array, bias: Array | None, lora_a: Array,
                    lora_b: Array, scale: float, out: Array | None = None) -> Array:
        """``x @ weight_t + bias + ((x @ lora_a) @ lora_b) * scale`` (see the protocol),
        written into ``out`` when given."""
        n = lora_shapes(x, weight_t, bias, lora_a, lora_b, out)[2]
        xp = self.xp
        y = xp.empty(x.shape[:-1] + (n,), dtype=x.dtype) if out is None else out
        xp.matmul(x, weight_t, out=y)
        if bias is not None:
            y += bias
        y += xp.matmul(xp.matmul(x, lora_a), lora_b) * scale
        return y
