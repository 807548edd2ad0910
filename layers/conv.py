"""2-D convolution and transposed convolution over NCHW images."""

from __future__ import annotations

import math
from typing import Any

import tensorcore as tc
import tensorcore.functional as F
from tensorcore import Tensor

from . import init
from .module import Module
from .parameter import Parameter


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


class _ConvBase(Module):
    """Shared construction and PyTorch's default initialisation for both convolutions."""

    def __init__(self, weight_shape: tuple[int, ...], bias_size: int, bias: bool, dtype: Any, device: str | None) -> None:
        super().__init__()
        self.weight = Parameter(tc.empty(*weight_shape, dtype=dtype, device=device))
        self.bias = Parameter(tc.empty(bias_size, dtype=dtype, device=device)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            init.fan_in_uniform_(self.bias, init.calculate_fan_in_and_fan_out(self.weight)[0])


def _check_channels(kind: str, in_channels: int, out_channels: int, groups: int) -> None:
    if min(in_channels, out_channels, groups) < 1 or in_channels % groups or out_channels % groups:
        raise ValueError(f"{kind}: groups={groups} must divide in_channels={in_channels} and out_channels={out_channels} (all positive)")


class Conv2d(_ConvBase):
    """``[N, Cin, H, W] -> [N, Cout, H', W']``, H' = (H + 2p - d(k-1) - 1) // s + 1.

    weight ``[Cout, Cin/groups, kh, kw]``, bias ``[Cout]``; ``padding='same'`` keeps H, W (stride 1).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, bias: bool = True, dtype: Any = tc.float32,
                 device: str | None = None) -> None:
        _check_channels("Conv2d", in_channels, out_channels, groups)
        kernel = _pair(kernel_size)
        super().__init__((out_channels, in_channels // groups) + kernel, out_channels, bias, dtype, device)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, groups={self.groups}, bias={self.bias is not None}")


class ConvTranspose2d(_ConvBase):
    """``[N, Cin, H, W] -> [N, Cout, H', W']``, H' = (H-1)s - 2p + d(k-1) + output_padding + 1.

    weight ``[Cin, Cout/groups, kh, kw]`` (PyTorch's layout), bias ``[Cout]``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 output_padding: Any = 0, groups: int = 1, bias: bool = True, dilation: Any = 1,
                 dtype: Any = tc.float32, device: str | None = None) -> None:
        _check_channels("ConvTranspose2d", in_channels, out_channels, groups)
        kernel = _pair(kernel_size)
        super().__init__((in_channels, out_channels // groups) + kernel, out_channels, bias, dtype, device)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.groups, self.dilation = groups, dilation

    def forward(self, x: Tensor) -> Tensor:
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, output_padding={self.output_padding}, bias={self.bias is not None}")
