"""LoRALinear: a frozen Linear plus a trainable low-rank update."""

from __future__ import annotations

import math

import tensorcore as tc
from tensorcore import Tensor

from . import init
from .linear import Linear
from .module import Module
from .parameter import Parameter


class LoRALinear(Module):
    """``y = base(x) + ((x @ A) @ B) * (alpha / rank)`` for ``x [*, in] -> y [*, out]``.

    ``lora_A [in, rank]`` ~ N(0, 1/rank) (variance), ``lora_B [rank, out]`` = 0, so the
    wrapped layer starts unchanged.  The base weight and bias are frozen; only A and B
    train.  ``merge()`` folds the update into the base weight (one matmul per call
    afterwards) and ``unmerge()`` takes it out again; both change ``structure_version``.
    """

    def __init__(self, base: Linear, rank: int = 4, alpha: float = 1.0) -> None:
        super().__init__()
        if not isinstance(base, Linear):
            raise TypeError(f"LoRALinear: base must be a Linear, got {type(base).__name__}")
        if rank < 1:
            raise ValueError(f"LoRALinear: rank must be positive, got {rank}")
        self.base, self.rank, self.alpha, self.scale = base, rank, alpha, alpha / rank
        base.requires_grad_(False)
        weight = base.weight
        self.lora_A = Parameter(tc.empty(base.in_features, rank, dtype=weight.dtype, device=weight.device))
        self.lora_B = Parameter(tc.zeros(rank, base.out_features, dtype=weight.dtype, device=weight.device))
        init.normal_(self.lora_A, 0.0, 1.0 / math.sqrt(rank))
        self.merged = False

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)
        if self.merged:
            return y
        return y + ((x @ self.lora_A) @ self.lora_B) * self.scale

    def _delta(self) -> Tensor:
        """The update as a weight: ``(A @ B)ᵀ * scale``, shaped like base.weight ``[out, in]``."""
        return (self.lora_A.detach() @ self.lora_B.detach()).T * self.scale

    def merge(self) -> "LoRALinear":
        """Fold the update into the base weight (idempotent)."""
        if not self.merged:
            with tc.no_grad():
                self.base.weight.add_(self._delta())
            self.merged = True
            self._structure_changed()
        return self

    def unmerge(self) -> "LoRALinear":
        """Take a merged update back out of the base weight (idempotent)."""
        if self.merged:
            with tc.no_grad():
                self.base.weight.add_(self._delta(), alpha=-1.0)
            self.merged = False
            self._structure_changed()
        return self

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, merged={self.merged}"
