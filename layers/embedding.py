"""Embedding: a lookup table of learned vectors."""

from __future__ import annotations

from typing import Any

import tensorcore as tc
import tensorcore.functional as F
from tensorcore import Tensor

from . import init
from .module import Module
from .parameter import Parameter


class Embedding(Module):
    """Integer indices ``[*] -> [*, embedding_dim]``; weight ``[num_embeddings, embedding_dim]`` ~ N(0, 1).

    Row ``padding_idx`` (if given) starts at zero and receives no gradient, as in PyTorch.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 dtype: Any = tc.float32, device: str | None = None) -> None:
        super().__init__()
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx {padding_idx} is out of range for {num_embeddings} embeddings")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.weight = Parameter(tc.empty(num_embeddings, embedding_dim, dtype=dtype, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with tc.no_grad():
                self.weight[self.padding_idx] = 0.0

    def forward(self, indices: Tensor) -> Tensor:
        weight = self.weight
        if self.padding_idx is not None:
            # Same values, but the padding row's gradient path is cut.
            keep = tc.ones(self.num_embeddings, 1, dtype=weight.dtype, device=weight.device)
            keep[self.padding_idx] = 0.0
            weight = weight * keep + weight.detach() * (1.0 - keep)
        return F.embedding(indices, weight)

    def extra_repr(self) -> str:
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"
