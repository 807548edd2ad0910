"""The layers of CLIP's text transformer, named as transformers' ``modeling_clip``.

A pre-LayerNorm transformer: token + position embeddings, then ``num_hidden_layers``
layers of ``x + attn(ln1(x))`` and ``x + mlp(ln2(x))``, with causal self-attention
(each token sees itself and the tokens before it) and an optional padding mask.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

import tensorcore as tc
import tensorcore.functional as F
from layers import Embedding, LayerNorm, Linear, Module, ModuleList
from tensorcore import Tensor


def _quick_gelu(x: Tensor) -> Tensor:
    return x * F.sigmoid(x * 1.702)


# hidden_act -> function, as transformers' ACT2FN reads the names CLIP configs use
HIDDEN_ACTS: dict[str, Callable[[Tensor], Tensor]] = {
    "quick_gelu": _quick_gelu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class CLIPTextEmbeddings(Module):
    """``token_embedding(ids) + position_embedding(0..L-1)`` for ids [B, L] -> [B, L, hidden]."""

    def __init__(self, vocab_size: int, hidden_size: int, max_position_embeddings: int) -> None:
        super().__init__()
        self.token_embedding = Embedding(vocab_size, hidden_size)
        self.position_embedding = Embedding(max_position_embeddings, hidden_size)

    def forward(self, input_ids: Tensor) -> Tensor:
        positions = tc.arange(input_ids.shape[1], dtype=tc.int64, device=input_ids.device)
        return self.token_embedding(input_ids) + self.position_embedding(positions)


class CLIPAttention(Module):
    """Multi-head self-attention with ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``.

    ``mask`` is None (causal attention) or a bool [B, 1, L, L] of the key positions each
    query may see; a query that may see none gets a zero attention output, as PyTorch's
    ``scaled_dot_product_attention`` gives it.  The softmax accumulates in float32 for
    half-precision inputs.
    """

    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.q_proj = Linear(hidden_size, hidden_size)
        self.k_proj = Linear(hidden_size, hidden_size)
        self.v_proj = Linear(hidden_size, hidden_size)
        self.out_proj = Linear(hidden_size, hidden_size)

    def _heads(self, x: Tensor) -> Tensor:
        """[B, L, hidden] -> [B, heads, L, head_dim]."""
        return x.reshape(x.shape[0], x.shape[1], self.num_heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: Tensor, mask: tuple[Tensor, Tensor] | None = None) -> Tensor:
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            visible, seen = mask
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible) * seen
        b, length = x.shape[0], x.shape[1]
        return self.out_proj(out.permute(0, 2, 1, 3).reshape(b, length, self.num_heads * self.head_dim))


def attention_mask(padding: Tensor, dtype: Any) -> tuple[Tensor, Tensor]:
    """The causal mask combined with a padding mask [B, L] (nonzero = a real token).

    Returns ``visible`` [B, 1, L, L] (bool, True where a query may see a key; a query that
    may see no key sees them all, so its softmax stays finite) and ``seen`` [B, 1, L, 1]
    (1 where a query sees some key, else 0, in ``dtype``) to zero the others' outputs.
    """
    b, length = padding.shape
    causal = tc.from_numpy(np.tril(np.ones((length, length), dtype=bool))).to(padding.device)
    allowed = causal.reshape(1, 1, length, length) & (padding != 0).reshape(b, 1, 1, length)
    seen = allowed.to(dtype=dtype).sum(axis=-1, keepdims=True) > 0
    return allowed | ~seen, seen.to(dtype=dtype)


class CLIPMLP(Module):
    """``fc2(act(fc1(x)))``."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str) -> None:
        super().__init__()
        self.act = HIDDEN_ACTS[hidden_act]
        self.fc1 = Linear(hidden_size, intermediate_size)
        self.fc2 = Linear(intermediate_size, hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(Module):
    """``x + self_attn(layer_norm1(x))``, then ``x + mlp(layer_norm2(x))``."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_heads: int, hidden_act: str, eps: float) -> None:
        super().__init__()
        self.self_attn = CLIPAttention(hidden_size, num_heads)
        self.layer_norm1 = LayerNorm(hidden_size, eps=eps)
        self.mlp = CLIPMLP(hidden_size, intermediate_size, hidden_act)
        self.layer_norm2 = LayerNorm(hidden_size, eps=eps)

    def forward(self, x: Tensor, mask: tuple[Tensor, Tensor] | None = None) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x), mask)
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(Module):
    """``layers``: the stack of encoder layers."""

    def __init__(self, num_layers: int, hidden_size: int, intermediate_size: int, num_heads: int,
                 hidden_act: str, eps: float) -> None:
        super().__init__()
        self.layers = ModuleList([CLIPEncoderLayer(hidden_size, intermediate_size, num_heads, hidden_act, eps)
                                  for _ in range(num_layers)])

    def forward(self, x: Tensor, mask: tuple[Tensor, Tensor] | None = None) -> list[Tensor]:
        """Every layer's input, then the last layer's output (``num_layers + 1`` tensors)."""
        states = [x]
        for layer in self.layers:
            states.append(layer(states[-1], mask))
        return states
