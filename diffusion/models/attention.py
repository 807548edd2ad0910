"""Attention over the pixels of a feature map, as diffusers' UNet and VAE blocks build it.

Parameter names follow diffusers' ``Attention``: ``group_norm``, ``to_q``, ``to_k``,
``to_v``, ``to_out.0``.  Self-attention by default; with ``cross_attention_dim`` the
keys and values come from a context sequence [B, L, D] instead.
"""

from __future__ import annotations

import tensorcore.functional as F
from layers import Dropout, GroupNorm, Linear, Module, ModuleList
from tensorcore import Tensor


class Attention(Module):
    """``x + to_out(softmax(Q Kᵀ / √d) V)`` over the H·W tokens of ``x`` [B, C, H, W].

    Q comes from ``group_norm(x)`` (when ``norm_num_groups`` is given), K and V from the
    same tokens or from ``context`` [B, L, cross_attention_dim]; ``heads`` heads of
    ``dim_head`` channels each.  The sum is divided by ``rescale_output_factor``.
    """

    def __init__(self, query_dim: int, heads: int, dim_head: int, norm_num_groups: int | None = None,
                 eps: float = 1e-5, cross_attention_dim: int | None = None, rescale_output_factor: float = 1.0,
                 dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        if heads < 1 or dim_head < 1:
            raise ValueError(f"Attention: heads and dim_head must be positive, got heads={heads}, dim_head={dim_head}")
        inner = heads * dim_head
        self.query_dim, self.heads, self.dim_head = query_dim, heads, dim_head
        self.cross_attention_dim = cross_attention_dim
        self.scale, self.rescale_output_factor = dim_head ** -0.5, rescale_output_factor
        self.group_norm = GroupNorm(norm_num_groups, query_dim, eps=eps) if norm_num_groups is not None else None
        kv_dim = cross_attention_dim or query_dim
        self.to_q = Linear(query_dim, inner, bias=bias)
        self.to_k = Linear(kv_dim, inner, bias=bias)
        self.to_v = Linear(kv_dim, inner, bias=bias)
        self.to_out = ModuleList([Linear(inner, query_dim), Dropout(dropout)])

    def _heads(self, x: Tensor) -> Tensor:
        """[B, L, heads * d] -> [B, heads, L, d]."""
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.dim_head).permute(0, 2, 1, 3)

    def _check(self, x: Tensor, context: Tensor | None) -> None:
        if x.ndim != 4 or x.shape[1] != self.query_dim:
            raise ValueError(f"Attention: expected input [B, {self.query_dim}, H, W], got {x.shape}")
        if self.cross_attention_dim is None:
            if context is not None:
                raise ValueError("Attention: this is a self-attention block; it takes no context")
        elif context is None or context.ndim != 3 or context.shape[0] != x.shape[0] or context.shape[2] != self.cross_attention_dim:
            got = None if context is None else context.shape
            raise ValueError(f"Attention: expected context [{x.shape[0]}, L, {self.cross_attention_dim}], got {got}")

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        self._check(x, context)
        b, c, h, w = x.shape
        hidden = x if self.group_norm is None else self.group_norm(x)
        tokens = hidden.reshape(b, c, h * w).transpose(1, 2)
        source = tokens if context is None else context
        q, k, v = self._heads(self.to_q(tokens)), self._heads(self.to_k(source)), self._heads(self.to_v(source))
        out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        out = out.permute(0, 2, 1, 3).reshape(b, h * w, self.heads * self.dim_head)
        out = self.to_out[1](self.to_out[0](out))
        out = out.transpose(1, 2).reshape(b, c, h, w) + x
        return out if self.rescale_output_factor == 1.0 else out / self.rescale_output_factor

    def extra_repr(self) -> str:
        cross = f", cross_attention_dim={self.cross_attention_dim}" if self.cross_attention_dim else ""
        return f"query_dim={self.query_dim}, heads={self.heads}, dim_head={self.dim_head}{cross}"
