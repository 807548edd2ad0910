"""Pooling and resampling of NCHW images."""

from __future__ import annotations

from typing import Any

import tensorcore.functional as F
from tensorcore import Tensor
from tensorcore.ops.conv import scale_pair

from .module import Module


class MaxPool2d(Module):
    """``[N, C, H, W] -> [N, C, H', W']`` with H' = (H + 2p - k) // s + 1; stride defaults to the kernel."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x: Tensor) -> Tensor:
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(MaxPool2d):
    """Average pooling; zero padding counts in the divisor (PyTorch's count_include_pad=True)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding)


class Upsample(Module):
    """Resize ``[N, C, H, W]`` by ``size`` or ``scale_factor``, mode 'nearest' or 'bilinear'."""

    def __init__(self, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                 align_corners: bool | None = None) -> None:
        super().__init__()
        if (size is None) == (scale_factor is None):
            raise ValueError("Upsample: give exactly one of size and scale_factor")
        if mode not in ("nearest", "bilinear"):
            raise ValueError(f"Upsample: mode must be 'nearest' or 'bilinear', got {mode!r}")
        if scale_factor is not None:
            scale_pair(scale_factor, "Upsample")
        self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners

    def forward(self, x: Tensor) -> Tensor:
        return F.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners)

    def extra_repr(self) -> str:
        what = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}"
