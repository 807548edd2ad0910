"""2-D convolution (NCHW) as im2col + one batched matmul over the groups.

``x`` [N, C, H, W] is padded and viewed (no copy) as the windows
[N, C, kh, kw, Ho, Wo] with ``as_strided``; one copy lays them out as the column
matrix [groups, C/groups * kh * kw, N * Ho * Wo], and one ``matmul`` with the weight
[groups, Cout/groups, C/groups * kh * kw] gives every output.  The gradients reuse the
same column layout; the input gradient scatters columns back (col2im) with one
strided add per kernel offset, never a loop over pixels.
"""

from __future__ import annotations

from typing import Any

import numpy

from .act import check_activation
from .upsample import check_image

Array = Any
Pair = tuple[int, int]
Shape = tuple[int, ...]


def conv_out_size(op: str, size: int, kernel: int, stride: int, pad: int,
                  dilation: int) -> int:
    """Output length of a sliding window; raises when the window does not fit."""
    if stride < 1 or dilation < 1 or pad < 0 or kernel < 1:
        raise ValueError(f"{op}: need kernel, stride, dilation >= 1 and padding >= 0, got "
                         f"kernel={kernel} stride={stride} padding={pad} "
                         f"dilation={dilation}")
    out = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    if out < 1:
        raise ValueError(f"{op}: input size {size} (padding {pad}) is smaller than the "
                         f"dilated kernel {dilation * (kernel - 1) + 1}")
    return out


def window_slice(offset: int, dilation: int, stride: int, n_out: int) -> slice:
    """The positions, in padded input coordinates, that kernel tap ``offset`` reads for
    outputs 0..n_out-1."""
    start = offset * dilation
    return slice(start, start + stride * (n_out - 1) + 1, stride)


class NumpyConvKernels:
    """conv2d and its two gradients for any NumPy-like ``xp``."""

    xp: Any

    def _conv_geometry(self, op: str, x_shape: Shape, w_shape: Shape, stride: Pair,
                       padding: Pair, dilation: Pair, groups: int) -> Pair:
        """Validate shapes and return the output size (Ho, Wo)."""
        if len(x_shape) != 4 or len(w_shape) != 4:
            raise ValueError(f"{op}: expected x [N, C, H, W] and weight [Cout, Cin/groups,"
                             f" kh, kw], got shapes {tuple(x_shape)} and {tuple(w_shape)}")
        cin, cout, cin_g = x_shape[1], w_shape[0], w_shape[1]
        if groups < 1 or cout % groups or cin != cin_g * groups:
            raise ValueError(f"{op}: x with {cin} channels and weight {tuple(w_shape)} do "
                             f"not fit groups={groups}")
        ho = conv_out_size(op, x_shape[2], w_shape[2], stride[0], padding[0], dilation[0])
        wo = conv_out_size(op, x_shape[3], w_shape[3], stride[1], padding[1], dilation[1])
        return ho, wo

    def _im2col(self, x: Array, kernel: Pair, out_hw: Pair, stride: Pair, padding: Pair,
                dilation: Pair, groups: int) -> Array:
        """x [N, C, H, W] -> columns [groups, C/groups * kh * kw, N * Ho * Wo]."""
        xp = self.xp
        n, c = x.shape[:2]
        (kh, kw), (ho, wo) = kernel, out_hw
        if padding != (0, 0):
            ph, pw = padding
            x = xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        sn, sc, sh, sw = x.strides
        windows = xp.lib.stride_tricks.as_strided(
            x, shape=(n, c, kh, kw, ho, wo),
            strides=(sn, sc, sh * dilation[0], sw * dilation[1], sh * stride[0],
                     sw * stride[1]))
        windows = windows.transpose(1, 2, 3, 0, 4, 5)
        return windows.reshape(groups, c // groups * kh * kw, n * ho * wo)

    @staticmethod
    def _grad_by_group(grad: Array, groups: int) -> Array:
        """grad [N, Cout, Ho, Wo] -> [groups, Cout/groups, N * Ho * Wo]."""
        n, cout, ho, wo = grad.shape
        by_group = grad.reshape(n, groups, cout // groups, ho * wo).transpose(1, 2, 0, 3)
        return by_group.reshape(groups, cout // groups, n * ho * wo)

    def conv2d(self, x: Array, w: Array, stride: Pair, padding: Pair,
               dilation: Pair, groups: int, bias: Array | None = None, act: str = "none",
               residual: Array | None = None, residual_scale: float = 1.0,
               out: Array | None = None) -> Array:
        """Cross-correlation of x [N, C, H, W] with w [Cout, C/groups, kh, kw], then the
        epilogue ``(act(y + bias) + residual) * residual_scale``, into ``out`` when given."""
        ho, wo = self._conv_geometry("conv2d", x.shape, w.shape, stride, padding,
                                     dilation, groups)
        self._check_epilogue("conv2d", (x.shape[0], w.shape[0], ho, wo), bias, act, residual)
        self._check_out("conv2d", out, (x.shape[0], w.shape[0], ho, wo), x.dtype)
        cout, kh, kw = w.shape[0], w.shape[2], w.shape[3]
        cols = self._im2col(x, (kh, kw), (ho, wo), stride, padding, dilation, groups)
        y = self.xp.matmul(w.reshape(groups, cout // groups, -1), cols)
        y = y.reshape(cout, x.shape[0], ho, wo).transpose(1, 0, 2, 3)
        return self._into(out, self._conv_epilogue(self.xp.ascontiguousarray(y), bias, act, residual,
                                                   residual_scale))

    def group_norm_conv2d(self, x: Array, norm: tuple, w: Array, stride: Pair, padding: Pair,
                          dilation: Pair, groups: int, bias: Array | None = None,
                          act: str = "none", residual: Array | None = None,
                          residual_scale: float = 1.0, out: Array | None = None) -> Array:
        """The two calls it stands for: GroupNorm (+ activation), then the convolution."""
        if not isinstance(norm, tuple) or len(norm) != 6:
            raise TypeError(f"group_norm_conv2d: norm must be group_norm's arguments after x, "
                            f"(weight, bias, groups, eps, act, shift), got {norm!r}")
        if out is not None:
            ho, wo = self._conv_geometry("group_norm_conv2d", x.shape, w.shape, stride, padding,
                                         dilation, groups)
            self._check_out("group_norm_conv2d", out, (x.shape[0], w.shape[0], ho, wo), x.dtype)
        y = self.group_norm(x, *norm)[0]
        return self.conv2d(y, w, stride, padding, dilation, groups, bias, act, residual,
                           residual_scale, out=out)

    def upsample_conv2d(self, x: Array, out_hw: Pair, w: Array, stride: Pair, padding: Pair,
                        dilation: Pair, groups: int, bias: Array | None = None,
                        act: str = "none", residual: Array | None = None,
                        residual_scale: float = 1.0, out: Array | None = None) -> Array:
        """The two calls it stands for: nearest upsampling to ``out_hw``, then the
        convolution (every argument checked before either runs)."""
        self._check_upsample_conv(x, out_hw, w, stride, padding, dilation, groups, bias, act,
                                  residual, out)
        y = self.upsample_nearest2d(x, out_hw)
        return self.conv2d(y, w, stride, padding, dilation, groups, bias, act, residual,
                           residual_scale, out=out)

    def _check_upsample_conv(self, x: Array, out_hw: Pair, w: Array, stride: Pair, padding: Pair,
                             dilation: Pair, groups: int, bias: Array | None, act: str,
                             residual: Array | None, out: Array | None) -> None:
        """Raise on a bad upsample_conv2d call."""
        check_image("upsample_conv2d", x.shape, out_hw)
        ho, wo = self._conv_geometry("upsample_conv2d", (*x.shape[:2], *out_hw), w.shape, stride,
                                     padding, dilation, groups)
        self._check_epilogue("upsample_conv2d", (x.shape[0], w.shape[0], ho, wo), bias, act, residual)
        self._check_out("upsample_conv2d", out, (x.shape[0], w.shape[0], ho, wo), x.dtype)

    @staticmethod
    def _check_out(op: str, out: Array | None, shape: Shape, dtype: Any) -> None:
        """Raise a ValueError unless ``out`` is None or a C-contiguous array of the
        result's shape and dtype."""
        if out is not None and (tuple(out.shape) != tuple(shape) or out.dtype != dtype
                                or not out.flags.c_contiguous):
            raise ValueError(f"{op}: out must be a C-contiguous {numpy.dtype(dtype).name} array of shape "
                             f"{tuple(shape)}, got {getattr(out.dtype, 'name', out.dtype)} {tuple(out.shape)}"
                             f"{'' if out.flags.c_contiguous else ' (not C-contiguous)'}")

    @staticmethod
    def _into(out: Array | None, y: Array) -> Array:
        """y, or y written into ``out`` (checked by ``_check_out``)."""
        if out is None:
            return y
        out[...] = y
        return out

    @staticmethod
    def _check_epilogue(op: str, out_shape: Shape, bias: Array | None, act: str,
                        residual: Array | None) -> None:
        """Raise a ValueError unless bias is [Cout], residual has the output's shape and
        act is a known activation."""
        check_activation(op, act)
        if bias is not None and tuple(bias.shape) != (out_shape[1],):
            raise ValueError(f"{op}: bias must have shape ({out_shape[1]},), got "
                             f"{tuple(bias.shape)}")
        if residual is not None and tuple(residual.shape) != tuple(out_shape):
            raise ValueError(f"{op}: residual must have the output's shape {tuple(out_shape)},"
                             f" got {tuple(residual.shape)}")

    def _conv_epilogue(self, y: Array, bias: Array | None, act: str, residual: Array | None,
                       residual_scale: float) -> Array:
        """(act(y + bias) + residual) * residual_scale from the backend's own primitives
        (terms left out when not given): the generic form of the fused epilogue."""
        if bias is not None or act != "none":
            y = self.bias_act(y, bias, act, 1)
        if residual is not None:
            y = self.binary("add", y, residual)
        if residual_scale != 1.0:
            y = self.binary("mul", y, self.full((), residual_scale, y.dtype))
        return y

    def conv2d_grad_weight(self, grad: Array, x: Array, w_shape: Shape, stride: Pair,
                           padding: Pair, dilation: Pair, groups: int) -> Array:
        """Gradient of conv2d w.r.t. its weight, shaped ``w_shape``."""
        ho, wo = self._conv_grad_geometry("conv2d_grad_weight", grad, x.shape, w_shape, stride,
                                          padding, dilation, groups)
        cols = self._im2col(x, (w_shape[2], w_shape[3]), (ho, wo), stride, padding,
                            dilation, groups)
        dw = self.xp.matmul(self._grad_by_group(grad, groups), cols.transpose(0, 2, 1))
        return dw.reshape(w_shape)

    def conv2d_grad_input(self, grad: Array, w: Array, x_shape: Shape, stride: Pair,
                          padding: Pair, dilation: Pair, groups: int) -> Array:
        """Gradient of conv2d w.r.t. its input; also the forward of conv_transpose2d."""
        xp = self.xp
        ho, wo = self._conv_grad_geometry("conv2d_grad_input", grad, x_shape, w.shape, stride,
                                          padding, dilation, groups)
        n, c, h, wd = x_shape
        cout, kh, kw = w.shape[0], w.shape[2], w.shape[3]
        w_t = w.reshape(groups, cout // groups, -1).transpose(0, 2, 1)
        cols = xp.matmul(w_t, self._grad_by_group(grad, groups))
        cols = cols.reshape(c, kh, kw, n, ho, wo)
        (ph, pw), (sh, sw), (dh, dw) = padding, stride, dilation
        dx = xp.zeros((c, n, h + 2 * ph, wd + 2 * pw), dtype=cols.dtype)
        for i in range(kh):
            rows = window_slice(i, dh, sh, ho)
            for j in range(kw):
                dx[:, :, rows, window_slice(j, dw, sw, wo)] += cols[:, i, j]
        dx = dx[:, :, ph:ph + h, pw:pw + wd].transpose(1, 0, 2, 3)
        return xp.ascontiguousarray(dx)

    def _conv_grad_geometry(self, op: str, grad: Array, x_shape: Shape, w_shape: Shape,
                            stride: Pair, padding: Pair, dilation: Pair, groups: int) -> Pair:
        """Validate a gradient call (the geometry, and grad against the output it implies)
        and return the output size (Ho, Wo)."""
        ho, wo = self._conv_geometry(op, x_shape, w_shape, stride, padding, dilation, groups)
        expected = (x_shape[0], w_shape[0], ho, wo)
        if tuple(grad.shape) != expected:
            raise ValueError(f"{op}: grad has shape {tuple(grad.shape)}, expected {expected}")
        return ho, wo
