"""Normalisation layers: BatchNorm2d, LayerNorm, GroupNorm."""

from __future__ import annotations

from typing import Any, Sequence

import tensorcore as tc
import tensorcore.functional as F
from tensorcore import Tensor

from .module import Module
from .parameter import Parameter


class BatchNorm2d(Module):
    """``[N, C, H, W] -> same``; normalises each channel over N, H, W.

    Training uses batch statistics and updates ``running_mean`` / ``running_var``
    (unbiased variance, weight ``momentum``); eval uses the running statistics.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True, dtype: Any = tc.float32, device: str | None = None) -> None:
        super().__init__()
        if not isinstance(momentum, float | int) or not 0.0 <= momentum <= 1.0:
            raise ValueError(f"BatchNorm2d: momentum must be a number in [0, 1], got {momentum!r}")
        self.num_features, self.eps, self.momentum = num_features, eps, float(momentum)
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(tc.ones(num_features, dtype=dtype, device=device)) if affine else None
        self.bias = Parameter(tc.zeros(num_features, dtype=dtype, device=device)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", tc.zeros(num_features, dtype=dtype, device=device))
            self.register_buffer("running_var", tc.ones(num_features, dtype=dtype, device=device))
            self.register_buffer("num_batches_tracked", tc.zeros((), dtype=tc.int64, device=device))

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4 or x.shape[1] != self.num_features:
            raise ValueError(f"BatchNorm2d: expected input [N, {self.num_features}, H, W], got {x.shape}")
        use_batch_stats = self.training or not self.track_running_stats
        running = (self.running_mean, self.running_var) if self.track_running_stats else (None, None)
        if self.training and self.track_running_stats:
            with tc.no_grad():
                self.num_batches_tracked.add_(1)
        return F.batch_norm(x, running[0], running[1], self.weight, self.bias, use_batch_stats, self.momentum, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}"


class LayerNorm(Module):
    """``[*, *normalized_shape] -> same``; normalises over the trailing ``normalized_shape`` dims."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, dtype: Any = tc.float32, device: str | None = None) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = shape, eps
        self.weight = Parameter(tc.ones(*shape, dtype=dtype, device=device)) if elementwise_affine else None
        self.bias = Parameter(tc.zeros(*shape, dtype=dtype, device=device)) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class GroupNorm(Module):
    """``[N, C, *] -> same``; normalises over each group of C/num_groups channels and the spatial dims."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 dtype: Any = tc.float32, device: str | None = None) -> None:
        super().__init__()
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_groups={num_groups} must divide num_channels={num_channels}")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Parameter(tc.ones(num_channels, dtype=dtype, device=device)) if affine else None
        self.bias = Parameter(tc.zeros(num_channels, dtype=dtype, device=device)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}"
