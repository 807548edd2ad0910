"""Convolution, pooling and upsampling over NCHW images."""

from __future__ import annotations

from typing import Any

from ..autograd import Function
from ..sizes import check_factor, check_size
from ..tensor import Tensor
from .movement import pad

Pair = tuple[int, int]


def _pair(value: int | tuple[int, int] | list[int], op: str, name: str) -> Pair:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise ValueError(f"{op}: {name} must be an int or a pair of ints, got {value!r}")
    return pair  # type: ignore[return-value]


def _check_image(x: Tensor, op: str) -> None:
    if x.ndim != 4:
        raise ValueError(f"{op}: expected a 4-D NCHW input, got shape {x.shape}")


class Conv2d(Function):
    def forward(self, x, w, b, stride, padding, dilation, groups):
        self.x, self.w, self.has_bias = x, w, b is not None
        self.geometry = stride, padding, dilation, groups
        return self.backend.conv2d(x, w, *self.geometry, bias=b)  # bias fused in the epilogue

    def backward(self, g):
        be = self.backend
        grad_x = be.conv2d_grad_input(g, self.w, self.x.shape, *self.geometry) if self.needs_grad(0) else None
        grad_w = be.conv2d_grad_weight(g, self.x, self.w.shape, *self.geometry) if self.needs_grad(1) else None
        grad_b = be.reduce("sum", g, (0, 2, 3), False) if self.has_bias else None
        return grad_x, grad_w, grad_b, None, None, None, None


class ConvTranspose2d(Function):
    """The adjoint of Conv2d: its forward is conv2d's input gradient."""

    def forward(self, x, w, b, out_shape, stride, padding, dilation, groups):
        self.x, self.w, self.has_bias = x, w, b is not None
        self.geometry = stride, padding, dilation, groups
        y = self.backend.conv2d_grad_input(x, w, out_shape, *self.geometry)
        return y if b is None else self.backend.bias_act(y, b, "none", 1)

    def backward(self, g):
        be = self.backend
        grad_x = be.conv2d(g, self.w, *self.geometry) if self.needs_grad(0) else None
        grad_w = be.conv2d_grad_weight(self.x, g, self.w.shape, *self.geometry) if self.needs_grad(1) else None
        grad_b = be.reduce("sum", g, (0, 2, 3), False) if self.has_bias else None
        return grad_x, grad_w, grad_b, None, None, None, None, None


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1,
           padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Tensor:
    """2-D cross-correlation, as ``torch.nn.functional.conv2d`` (padding may be 'same')."""
    op = "conv2d"
    _check_image(x, op)
    stride, dilation = _pair(stride, op, "stride"), _pair(dilation, op, "dilation")
    if weight.ndim != 4:
        raise ValueError(f"{op}: weight must be [Cout, Cin/groups, kh, kw], got {weight.shape}")
    cout, cin_g, kh, kw = weight.shape
    if padding == "same":
        if stride != (1, 1):
            raise ValueError(f"{op}: padding='same' needs stride 1, got {stride}")
        padding = (dilation[0] * (kh - 1) // 2, dilation[1] * (kw - 1) // 2)
        if (dilation[0] * (kh - 1)) % 2 or (dilation[1] * (kw - 1)) % 2:
            raise ValueError(f"{op}: padding='same' needs an odd effective kernel, got {(kh, kw)} with dilation {dilation}")
    padding = _pair(padding, op, "padding")
    _check_geometry(op, x.shape, weight.shape, stride, padding, dilation, groups, cin_g * groups, cout)
    if bias is not None and bias.shape != (cout,):
        raise ValueError(f"{op}: bias must have shape ({cout},), got {bias.shape}")
    return Conv2d.apply(x, weight, bias, stride, padding, dilation, groups)


def conv_transpose2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1,
                     padding: Any = 0, output_padding: Any = 0, groups: int = 1,
                     dilation: Any = 1) -> Tensor:
    """Transposed convolution, as ``torch.nn.functional.conv_transpose2d``."""
    op = "conv_transpose2d"
    _check_image(x, op)
    stride, padding = _pair(stride, op, "stride"), _pair(padding, op, "padding")
    dilation, output_padding = _pair(dilation, op, "dilation"), _pair(output_padding, op, "output_padding")
    if weight.ndim != 4:
        raise ValueError(f"{op}: weight must be [Cin, Cout/groups, kh, kw], got {weight.shape}")
    cin, cout_g, kh, kw = weight.shape
    if groups < 1 or x.shape[1] != cin or cin % groups:
        raise ValueError(f"{op}: input has {x.shape[1]} channels, weight {weight.shape} expects {cin} with groups={groups}")
    if any(op_ >= max(s, d) for op_, s, d in zip(output_padding, stride, dilation)):
        raise ValueError(f"{op}: output_padding {output_padding} must be smaller than stride {stride} or dilation {dilation}")
    out_hw = tuple((n - 1) * s - 2 * p + d * (k - 1) + o + 1
                   for n, s, p, d, k, o in zip(x.shape[2:], stride, padding, dilation, (kh, kw), output_padding))
    if min(out_hw) <= 0:
        raise ValueError(f"{op}: output size {out_hw} is not positive for input {x.shape}")
    if bias is not None and bias.shape != (cout_g * groups,):
        raise ValueError(f"{op}: bias must have shape ({cout_g * groups},), got {bias.shape}")
    out_shape = check_size(op, (x.shape[0], cout_g * groups) + out_hw, x.dtype, x.device)
    # output_padding >= stride (allowed when the dilation is larger) makes conv2d of the output
    # longer than x; its adjoint then takes x zero-padded to that length
    extra_h, extra_w = (o // s for o, s in zip(output_padding, stride))
    if extra_h or extra_w:
        x = pad(x, (0, extra_w, 0, extra_h))
    return ConvTranspose2d.apply(x, weight, bias, out_shape, stride, padding, dilation, groups)


def _check_geometry(op: str, x_shape: tuple, w_shape: tuple, stride: Pair, padding: Pair,
                    dilation: Pair, groups: int, cin: int, cout: int) -> None:
    if groups < 1 or cout % groups:
        raise ValueError(f"{op}: groups={groups} must be positive and divide the {cout} output channels")
    if x_shape[1] != cin:
        raise ValueError(f"{op}: input has {x_shape[1]} channels, weight {w_shape} with groups={groups} expects {cin}")
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise ValueError(f"{op}: stride {stride} and dilation {dilation} must be >= 1, padding {padding} >= 0")
    for n, k, s, p, d in zip(x_shape[2:], w_shape[2:], stride, padding, dilation):
        if (n + 2 * p - d * (k - 1) - 1) // s + 1 <= 0:
            raise ValueError(f"{op}: kernel {w_shape[2:]} (dilation {dilation}) does not fit input {x_shape[2:]} with padding {padding}")


# ----- pooling -------------------------------------------------------------------------
class MaxPool2d(Function):
    def forward(self, x, kernel, stride, padding):
        self.shape = x.shape
        y, self.argmax = self.backend.max_pool2d(x, kernel, stride, padding)
        return y

    def backward(self, g):
        return self.backend.max_pool2d_backward(g, self.argmax, self.shape), None, None, None


class AvgPool2d(Function):
    def forward(self, x, kernel, stride, padding):
        self.shape, self.geometry = x.shape, (kernel, stride, padding)
        return self.backend.avg_pool2d(x, kernel, stride, padding)

    def backward(self, g):
        return self.backend.avg_pool2d_backward(g, self.shape, *self.geometry), None, None, None


def _pool_args(op: str, x: Tensor, kernel_size: Any, stride: Any, padding: Any) -> tuple[Pair, Pair, Pair]:
    _check_image(x, op)
    kernel = _pair(kernel_size, op, "kernel_size")
    stride = kernel if stride is None else _pair(stride, op, "stride")
    padding = _pair(padding, op, "padding")
    if min(kernel) < 1 or min(stride) < 1 or any(2 * p > k for p, k in zip(padding, kernel)):
        raise ValueError(f"{op}: kernel {kernel} and stride {stride} must be >= 1 and padding {padding} at most half the kernel")
    if any(n + 2 * p < k for n, p, k in zip(x.shape[2:], padding, kernel)):
        raise ValueError(f"{op}: kernel {kernel} is larger than the padded input {x.shape[2:]}")
    return kernel, stride, padding


def max_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    return MaxPool2d.apply(x, *_pool_args("max_pool2d", x, kernel_size, stride, padding))


def avg_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    return AvgPool2d.apply(x, *_pool_args("avg_pool2d", x, kernel_size, stride, padding))


# ----- upsampling ----------------------------------------------------------------------
class UpsampleNearest(Function):
    def forward(self, x, out_hw):
        self.shape = x.shape
        return self.backend.upsample_nearest2d(x, out_hw)

    def backward(self, g):
        return self.backend.upsample_nearest2d_backward(g, self.shape), None


class UpsampleBilinear(Function):
    def forward(self, x, out_hw, align_corners):
        self.shape, self.align_corners = x.shape, align_corners
        return self.backend.upsample_bilinear2d(x, out_hw, align_corners)

    def backward(self, g):
        return self.backend.upsample_bilinear2d_backward(g, self.shape, self.align_corners), None, None


def interpolate(x: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: bool | None = None) -> Tensor:
    """Resize NCHW images by ``size`` or ``scale_factor`` ('nearest' or 'bilinear')."""
    op = "interpolate"
    _check_image(x, op)
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{op}: give exactly one of size and scale_factor")
    if size is not None:
        out_hw = _pair(size, op, "size")
    else:
        out_hw = tuple(int(n * s) for n, s in zip(x.shape[2:], scale_pair(scale_factor, op)))
    if min(out_hw) < 1:
        raise ValueError(f"{op}: output size {out_hw} must be positive")
    check_size(op, x.shape[:2] + out_hw, x.dtype, x.device)
    if mode == "nearest":
        if align_corners is not None:
            raise ValueError(f"{op}: align_corners only applies to mode 'bilinear'")
        return UpsampleNearest.apply(x, out_hw)
    if mode == "bilinear":
        return UpsampleBilinear.apply(x, out_hw, bool(align_corners))
    raise ValueError(f"{op}: mode must be 'nearest' or 'bilinear', got {mode!r}")


upsample = interpolate


def scale_pair(scale_factor: Any, op: str) -> tuple[float, float]:
    """``scale_factor`` (one number or a pair) as two finite positive floats, else a ValueError naming ``op``."""
    scales = (scale_factor, scale_factor) if not isinstance(scale_factor, tuple | list) else tuple(scale_factor)
    if len(scales) != 2:
        raise ValueError(f"{op}: scale_factor must be a number or a pair of numbers, got {scale_factor!r}")
    return check_factor(op, "scale_factor", scales[0]), check_factor(op, "scale_factor", scales[1])
