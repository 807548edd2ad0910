"""Scaled dot-product attention over [..., L, D] tensors."""

from __future__ import annotations

import math

from .. import autograd
from ..autograd import Function
from ..tensor import Tensor
from . import elementwise as ew
from .movement import reshape


class Attention(Function):
    """``training``: keep what the backward needs -- the output and the rows' log-sum-exp
    where the backend recomputes the probabilities (flash attention on the GPU), else
    the probabilities; otherwise the backend's ``attention_output`` may skip them."""

    def forward(self, q, k, v, mask, causal, scale, training):
        if not training:
            return self.backend.attention_output(q, k, v, mask, causal, scale)
        self.q, self.k, self.v, self.causal, self.scale = q, k, v, causal, scale
        recomputed = self.backend.attention_lse(q, k, v, mask, causal, scale)
        if recomputed is not None:
            self.out, self.lse = recomputed
            return self.out
        self.lse = None
        out, self.probs = self.backend.attention(q, k, v, mask, causal, scale)
        return out

    def backward(self, g):
        if self.lse is not None:
            gq, gk, gv = self.backend.attention_lse_backward(g, self.q, self.k, self.v, self.out, self.lse,
                                                             self.causal, self.scale)
        else:
            gq, gk, gv = self.backend.attention_backward(g, self.q, self.k, self.v, self.probs, self.scale)
        return gq, gk, gv, None, None, None, None


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 is_causal: bool = False, scale: float | None = None) -> Tensor:
    """softmax(Q Kᵀ · scale + mask) V, as ``torch.nn.functional.scaled_dot_product_attention``.

    A bool mask keeps positions where it is True; a float mask is added to the scores.
    """
    op = "scaled_dot_product_attention"
    if query.ndim < 2 or key.ndim != query.ndim or value.ndim != query.ndim:
        raise ValueError(f"{op}: query, key and value need the same number (>= 2) of dims, got {query.shape}, {key.shape}, {value.shape}")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ValueError(f"{op}: shapes do not fit: query {query.shape}, key {key.shape}, value {value.shape}")
    if query.shape[:-2] != key.shape[:-2] or key.shape[:-2] != value.shape[:-2]:
        raise ValueError(f"{op}: batch dims differ: {query.shape[:-2]}, {key.shape[:-2]}, {value.shape[:-2]}")
    if attn_mask is not None and is_causal:
        raise ValueError(f"{op}: give either attn_mask or is_causal, not both")
    lead = query.shape[:-2]
    lq, lk = query.shape[-2], key.shape[-2]
    mask = None
    if attn_mask is not None:
        if attn_mask.dtype.kind == "b":
            attn_mask = ew.where(attn_mask, 0.0, float("-inf")).to(dtype=query.dtype)
        mask = attn_mask.detach().expand(lead + (lq, lk))
        mask = (mask if mask.ndim == 4 else mask.reshape((-1, 1, lq, lk))).data

    def as4d(t: Tensor) -> Tensor:
        """[B, H, L, D] as it lies (the heads of a projection are a strided view: no
        copy), any other rank as [N, 1, L, D]."""
        return t if t.ndim == 4 else reshape(t, (-1, 1) + t.shape[-2:])

    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    training = autograd.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    out = Attention.apply(as4d(query), as4d(key), as4d(value), mask, bool(is_causal), scale, training)
    return reshape(out, lead + (lq, value.shape[-1]))
