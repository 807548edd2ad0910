"""MultiHeadAttention with PyTorch's parameter layout, so torch weights load one to one."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import tensorcore as tc
import tensorcore.functional as F
from tensorcore import Tensor

from . import init
from .linear import Linear
from .module import Module
from .parameter import Parameter


class MultiHeadAttention(Module):
    """Multi-head scaled dot-product attention (self or cross).

    Shapes (``batch_first=False``, PyTorch's default): query ``[L, B, E]``, key
    ``[S, B, kdim]``, value ``[S, B, vdim]`` -> output ``[L, B, E]`` and, with
    ``need_weights``, weights ``[B, L, S]`` (or ``[B, H, L, S]`` unaveraged).  With
    ``batch_first=True`` the batch comes first; unbatched ``[L, E]`` inputs also work.

    Parameters: ``in_proj_weight [3E, E]`` and ``in_proj_bias [3E]`` when kdim = vdim = E,
    else ``q_proj_weight [E, E]``, ``k_proj_weight [E, kdim]``, ``v_proj_weight [E, vdim]``;
    ``out_proj`` a Linear(E, E).  Masks: ``key_padding_mask [B, S]`` and ``attn_mask``
    ``[L, S]`` or ``[B*H, L, S]``, bool (True = not allowed) or float (added to the scores);
    ``is_causal=True`` additionally hides future positions.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 kdim: int | None = None, vdim: int | None = None, batch_first: bool = False,
                 dtype: Any = tc.float32, device: str | None = None) -> None:
        super().__init__()
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError(f"MultiHeadAttention: num_heads={num_heads} must divide embed_dim={embed_dim}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.dropout, self.batch_first = dropout, batch_first
        self.packed = self.kdim == embed_dim and self.vdim == embed_dim
        def new(*shape: int) -> Parameter:
            return Parameter(tc.empty(*shape, dtype=dtype, device=device))
        if self.packed:
            self.in_proj_weight = new(3 * embed_dim, embed_dim)
        else:
            self.q_proj_weight = new(embed_dim, embed_dim)
            self.k_proj_weight = new(embed_dim, self.kdim)
            self.v_proj_weight = new(embed_dim, self.vdim)
        self.in_proj_bias = new(3 * embed_dim) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype, device=device)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """As PyTorch: xavier-uniform input projections, zero biases, out_proj weight as Linear."""
        weights = [self.in_proj_weight] if self.packed else [self.q_proj_weight, self.k_proj_weight, self.v_proj_weight]
        for w in weights:
            init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def _projections(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        e = self.embed_dim
        biases = [None] * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
        if self.packed and key is query and value is query:
            qkv = query @ self.in_proj_weight.T
            if self.in_proj_bias is not None:
                qkv = qkv + self.in_proj_bias
            return tuple(qkv.chunk(3, axis=-1))  # type: ignore[return-value]
        weights = (self.in_proj_weight[:e], self.in_proj_weight[e:2 * e], self.in_proj_weight[2 * e:]) if self.packed \
            else (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        out = []
        for x, w, b in zip((query, key, value), weights, biases):
            y = x @ w.T
            out.append(y if b is None else y + b)
        return out[0], out[1], out[2]

    def _mask(self, batch: int, lq: int, lk: int, like: Tensor, attn_mask: Tensor | None,
              key_padding_mask: Tensor | None, is_causal: bool) -> Tensor | None:
        """One additive float mask broadcastable to [B, H, Lq, Lk] (None when nothing is masked)."""
        parts = []
        if attn_mask is not None:
            if attn_mask.shape == (lq, lk):
                shape = (1, 1, lq, lk)
            elif attn_mask.shape == (batch * self.num_heads, lq, lk):
                shape = (batch, self.num_heads, lq, lk)
            else:
                raise ValueError(f"MultiHeadAttention: attn_mask must be [{lq}, {lk}] or [{batch * self.num_heads}, {lq}, {lk}], got {attn_mask.shape}")
            parts.append(_additive(attn_mask, like).reshape(shape))
        if key_padding_mask is not None:
            if key_padding_mask.shape != (batch, lk):
                raise ValueError(f"MultiHeadAttention: key_padding_mask must be [{batch}, {lk}], got {key_padding_mask.shape}")
            parts.append(_additive(key_padding_mask, like).reshape(batch, 1, 1, lk))
        if is_causal:
            causal = np.triu(np.full((lq, lk), -np.inf), 1)
            parts.append(tc.tensor(causal, dtype=like.dtype, device=like.device).reshape(1, 1, lq, lk))
        if not parts:
            return None
        mask = parts[0]
        for part in parts[1:]:
            mask = mask + part
        return mask

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
                key_padding_mask: Tensor | None = None, need_weights: bool = True, attn_mask: Tensor | None = None,
                average_attn_weights: bool = True, is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        """Returns ``(output, weights)``; key and value default to the query (self-attention)."""
        key = query if key is None else key
        value = key if value is None else value
        batched = query.ndim == 3
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError(f"MultiHeadAttention: expected 3-D (or unbatched 2-D) query/key/value, got {query.shape}, {key.shape}, {value.shape}")
        if not batched:
            query, key, value = _each(lambda t: t.unsqueeze(0), query, key, value)
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = _each(lambda t: t.transpose(0, 1), query, key, value)
        batch, lq, lk = query.shape[0], query.shape[1], key.shape[1]
        if query.shape[-1] != self.embed_dim or key.shape[-1] != self.kdim or value.shape[-1] != self.vdim or value.shape[1] != lk:
            raise ValueError(f"MultiHeadAttention: expected query [.., {self.embed_dim}], key [S, .., {self.kdim}], value [S, .., {self.vdim}]; "
                             f"got {query.shape}, {key.shape}, {value.shape}")
        q, k, v = (self._heads(t) for t in self._projections(query, key, value))
        mask = self._mask(batch, lq, lk, q, attn_mask, key_padding_mask, is_causal)
        dropout = self.dropout if self.training else 0.0
        weights = None
        if need_weights or dropout > 0.0:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            probs = F.softmax(scores if mask is None else scores + mask, -1)
            probs = F.dropout(probs, dropout, True)
            out = probs @ v
            weights = (probs.mean(axis=1) if average_attn_weights else probs) if need_weights else None
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = self.out_proj(out.permute(0, 2, 1, 3).reshape(batch, lq, self.embed_dim))
        if not batched:
            return out.squeeze(0), None if weights is None else weights.squeeze(0)
        return (out if self.batch_first else out.transpose(0, 1)), weights

    def _heads(self, x: Tensor) -> Tensor:
        """[B, L, E] -> [B, H, L, D]."""
        return x.reshape(x.shape[0], x.shape[1], self.num_heads, self.head_dim).permute(0, 2, 1, 3)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


def _each(fn: Any, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``fn`` applied to query, key and value, keeping shared inputs shared (self-attention stays detectable)."""
    new_query = fn(query)
    new_key = new_query if key is query else fn(key)
    new_value = new_key if value is key else new_query if value is query else fn(value)
    return new_query, new_key, new_value


def _additive(mask: Tensor, like: Tensor) -> Tensor:
    """A bool mask (True = masked) as 0 / -inf, or a float mask as is, in ``like``'s dtype."""
    if mask.device != like.device:
        raise ValueError(f"MultiHeadAttention: mask is on {mask.device}, inputs on {like.device}")
    if mask.dtype.kind == "b":
        return tc.where(mask, float("-inf"), 0.0).to(dtype=like.dtype)
    return mask.detach().to(dtype=like.dtype)
