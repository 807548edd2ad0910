"""Attention as diffusers' ``Attention`` builds it: over the pixels of a feature map or a token sequence.

Parameter names follow diffusers: ``group_norm``, ``to_q``, ``to_k``, ``to_v``,
``to_out.0``.  Self-attention by default; with ``cross_attention_dim`` the keys and
values come from a context sequence [B, L, D] instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorcore as tc
import tensorcore.functional as F
from layers import Dropout, GroupNorm, Linear, Module, ModuleList
from tensorcore import Tensor


@dataclass
class TextStates:
    """A cross-attention context whose keys and values were computed beforehand:
    ``states`` [B, L, D] and, by the id of each cross-attention ``Attention``, its
    (keys, values) as ``attend`` makes them from ``states``.  A denoising loop computes
    them once per generation (``UNet2DConditionModel.cross_attention_kv``): the text
    states do not change across steps, so neither do their projections."""

    states: Tensor
    kv: dict[int, tuple[Tensor, Tensor]]


class Attention(Module):
    """``to_out(softmax(Q Kᵀ / √d) V)`` over the tokens of ``x``, plus ``x`` when ``residual_connection``.

    ``x`` is a feature map [B, C, H, W] (its H·W pixels are the tokens, as the UNet's and
    VAE's attention blocks use it) or a sequence [B, L, C] (as a transformer block uses it).
    Q comes from ``group_norm(x)`` (when ``norm_num_groups`` is given), K and V from the
    same tokens or from ``context`` [B, L, cross_attention_dim]; ``heads`` heads of
    ``dim_head`` channels each.  ``upcast_attention`` computes the scores and softmax in
    float32 for half-precision inputs, as diffusers does.  The sum is divided by
    ``rescale_output_factor``.
    """

    def __init__(self, query_dim: int, heads: int, dim_head: int, norm_num_groups: int | None = None,
                 eps: float = 1e-5, cross_attention_dim: int | None = None, rescale_output_factor: float = 1.0,
                 dropout: float = 0.0, bias: bool = True, out_bias: bool = True, upcast_attention: bool = False,
                 residual_connection: bool = True) -> None:
        super().__init__()
        if heads < 1 or dim_head < 1:
            raise ValueError(f"Attention: heads and dim_head must be positive, got heads={heads}, dim_head={dim_head}")
        inner = heads * dim_head
        self.query_dim, self.heads, self.dim_head = query_dim, heads, dim_head
        self.cross_attention_dim = cross_attention_dim
        self.scale, self.rescale_output_factor = dim_head ** -0.5, rescale_output_factor
        self.upcast_attention, self.residual_connection = upcast_attention, residual_connection
        self.group_norm = GroupNorm(norm_num_groups, query_dim, eps=eps) if norm_num_groups is not None else None
        kv_dim = cross_attention_dim or query_dim
        self.to_q = Linear(query_dim, inner, bias=bias)
        self.to_k = Linear(kv_dim, inner, bias=bias)
        self.to_v = Linear(kv_dim, inner, bias=bias)
        self.to_out = ModuleList([Linear(inner, query_dim, bias=out_bias), Dropout(dropout)])

    def _heads(self, x: Tensor) -> Tensor:
        """[B, L, heads * d] -> [B, heads, L, d]."""
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.dim_head).permute(0, 2, 1, 3)

    def _check(self, x: Tensor, context: Tensor | None) -> None:
        if x.ndim not in (3, 4) or x.shape[1 if x.ndim == 4 else 2] != self.query_dim:
            raise ValueError(f"Attention: expected input [B, {self.query_dim}, H, W] or [B, L, {self.query_dim}], got {x.shape}")
        if self.cross_attention_dim is None:
            if context is not None:
                raise ValueError("Attention: this is a self-attention block; it takes no context")
        elif context is None or context.ndim != 3 or context.shape[0] != x.shape[0] or context.shape[2] != self.cross_attention_dim:
            got = None if context is None else context.shape
            raise ValueError(f"Attention: expected context [{x.shape[0]}, L, {self.cross_attention_dim}], got {got}")

    def _tokens(self, x: Tensor) -> Tensor:
        """The normalised input as tokens [B, L, query_dim]."""
        if x.ndim == 4:
            b, c, h, w = x.shape
            hidden = x if self.group_norm is None else self.group_norm(x)
            return hidden.reshape(b, c, h * w).transpose(1, 2)
        return x if self.group_norm is None else self.group_norm(x.transpose(1, 2)).transpose(1, 2)

    def keys_values(self, source: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values [B, heads, Lk, dim_head] of ``source`` [B, Lk, kv_dim]."""
        return self._heads(self.to_k(source)), self._heads(self.to_v(source))

    def attend(self, tokens: Tensor, source: Tensor | TextStates) -> Tensor:
        """Attention of ``tokens`` [B, Lq, query_dim] over ``source`` [B, Lk, kv_dim] (or its
        precomputed keys and values) -> [B, Lq, query_dim]."""
        q = self._heads(self.to_q(tokens))
        k, v = source.kv[id(self)] if isinstance(source, TextStates) else self.keys_values(source)
        upcast = self.upcast_attention and (q.dtype == tc.float16 or tc.dtypes.is_bfloat16(q.dtype))
        if upcast:
            q, k, v = q.to(dtype=tc.float32), k.to(dtype=tc.float32), v.to(dtype=tc.float32)
        out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        if upcast:
            out = out.to(dtype=tokens.dtype)
        out = out.permute(0, 2, 1, 3).reshape(tokens.shape[0], tokens.shape[1], self.heads * self.dim_head)
        return self.to_out[1](self.to_out[0](out))

    def forward(self, x: Tensor, context: Tensor | TextStates | None = None) -> Tensor:
        self._check(x, context.states if isinstance(context, TextStates) else context)
        tokens = self._tokens(x)
        out = self.attend(tokens, tokens if context is None else context)
        if x.ndim == 4:
            out = out.transpose(1, 2).reshape(x.shape)
        if self.residual_connection:
            out = out + x
        return out if self.rescale_output_factor == 1.0 else out / self.rescale_output_factor

    def extra_repr(self) -> str:
        cross = f", cross_attention_dim={self.cross_attention_dim}" if self.cross_attention_dim else ""
        return f"query_dim={self.query_dim}, heads={self.heads}, dim_head={self.dim_head}{cross}"
