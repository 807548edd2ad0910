"""Embedding lookup and dropout."""

from __future__ import annotations

from ..autograd import Function
from ..tensor import Tensor
from ..tracing import is_tracing
from .. import random


class Embedding(Function):
    def forward(self, weight, indices):
        self.indices, self.num = indices, weight.shape[0]
        return self.backend.getitem(weight, indices)

    def backward(self, g):
        return self.backend.embedding_backward(g, self.indices, self.num), None


def embedding(indices: Tensor, weight: Tensor) -> Tensor:
    """Rows of ``weight`` [num, dim] picked by integer ``indices`` [*] -> [*, dim]."""
    if indices.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be integers, got {indices.dtype}")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be [num_embeddings, dim], got {weight.shape}")
    if indices.device == "cpu" and indices.numel() and not is_tracing():
        # no host round trip on the GPU, nor in a trace: a plan cannot read the indices (a
        # replay meets an out-of-range index as the kernel's IndexError, as on the GPU)
        low, high = int(indices.min().item()), int(indices.max().item())
        if low < 0 or high >= weight.shape[0]:
            raise IndexError(f"embedding: indices must lie in [0, {weight.shape[0]}), got range [{low}, {high}]")
    return Embedding.apply(weight, indices.detach())


def dropout(x: Tensor, p: float = 0.5, training: bool = True, generator: random.Generator | None = None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p) while training."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    keep = random.rand(*x.shape, dtype=x.dtype, device=x.device, generator=generator) >= p
    return x * keep.to(dtype=x.dtype) * (1.0 / (1.0 - p))
