"""Attention on the CPU over short sequences: one fused kernel per direction.

A diffusion UNet's attention at its low-resolution levels attends over 16 or 64 pixels
per head.  There the reference's batched matrix products (one BLAS call per head, each
a few microseconds of work) and the copies that put the heads of a projection into
[B·H, L, D] order cost more than the arithmetic.  The kernels of
``kernels/attention.py`` read the heads as strided views where they lie and write the
output and the input gradients into [B, L, H, D] memory, returned as [B, H, L, D]
views: merging the heads back into [B, L, H·D] is then free.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import results
from .kernels import fast_path

Array = Any

MAX_SCORES = 1 << 14  # Lq·Lk above which the reference's BLAS products are faster
MAX_HEAD = 256  # head widths the per-task copies keep in L1


def _fits(q: Array, k: Array, v: Array, *more: Array) -> bool:
    """Float arrays of one dtype with attention's 4-D shapes, short enough for the kernel."""
    if not fast_path(q, k, v, *more) or not q.ndim == k.ndim == v.ndim == 4:
        return False
    (b, h, lq, d), (lk, dv) = q.shape, v.shape[2:]
    return (k.shape == (b, h, lk, d) and v.shape[:2] == (b, h) and 0 < lq * lk <= MAX_SCORES
            and 0 < d <= MAX_HEAD and 0 < dv <= MAX_HEAD)


def _heads_last(b: int, h: int, length: int, width: int, dtype: Any) -> Array:
    """A [B, H, L, D] view of new [B, L, H, D] memory."""
    return np.empty((b, length, h, width), dtype=dtype).transpose(0, 2, 1, 3)


class NumbaAttentionKernels:
    """``attention`` and ``attention_backward`` for short sequences (the reference's
    ``attention_output`` calls this ``attention``); other shapes and dtypes go to the
    reference."""

    def attention(self, q: Array, k: Array, v: Array, mask: Array | None,
                  causal: bool, scale: float, out: tuple | None = None) -> tuple[Array, Array]:
        """The reference's attention; ``out`` (output, probabilities) as ``results.py``
        takes it, the output of any strides."""
        if not _fits(q, k, v):
            return results.deliver_all("attention", out, super().attention(q, k, v, mask, causal, scale))
        from .kernels.attention import attention_heads

        (b, h, lq, _), (lk, dv) = q.shape, v.shape[2:]
        if mask is None:
            mask = np.zeros((1, 1, 1, 1), dtype=q.dtype)
        try:
            mask = np.broadcast_to(mask.astype(q.dtype, copy=False), (b, h, lq, lk))
        except ValueError:  # its message names the shapes
            return results.deliver_all("attention", out, super().attention(q, k, v, mask, causal, scale))
        given = results.items("attention", out, 2)
        results.check("attention", given[0], (b, h, lq, dv), q.dtype)
        results.check("attention", given[1], (b, h, lq, lk), q.dtype)
        output = _heads_last(b, h, lq, dv, q.dtype) if given[0] is None else given[0]
        probs = results.target(given[1], (b, h, lq, lk), q.dtype)
        attention_heads(q, k, v, mask, bool(causal), float(scale), output, probs)
        return output, results.deliver(given[1], probs)

    def attention_backward(self, grad: Array, q: Array, k: Array, v: Array,
                           probs: Array, scale: float, out: tuple | None = None
                           ) -> tuple[Array, Array, Array]:
        """The reference's attention backward; ``out`` (dq, dk, dv) as ``results.py``
        takes it, of any strides."""
        if not (_fits(q, k, v, grad, probs) and grad.shape == q.shape[:3] + v.shape[3:]
                and probs.shape == q.shape[:3] + k.shape[2:3]):
            return results.deliver_all("attention_backward", out,
                                       super().attention_backward(grad, q, k, v, probs, scale))
        (b, h, lq, d), (lk, dv) = q.shape, v.shape[2:]
        from .kernels.attention import attention_heads_backward

        given = results.items("attention_backward", out, 3)
        shapes = ((b, h, lq, d), (b, h, lk, d), (b, h, lk, dv))
        for g, shape in zip(given, shapes):
            results.check("attention_backward", g, shape, q.dtype)
        dq, dk, dv_ = (_heads_last(b, h, shape[2], shape[3], q.dtype) if g is None else g
                       for g, shape in zip(given, shapes))
        attention_heads_backward(grad, q, k, v, np.ascontiguousarray(probs), float(scale), dq, dk, dv_)
        return dq, dk, dv_
