"""Max and average pooling (NCHW) by looping over the kh * kw kernel taps.

Each tap reads one strided slice of the padded input for every output at once, so the
Python loop is over the few kernel positions, never over pixels.  The backward passes
add each tap's share back through the same slices.
"""

from __future__ import annotations

from typing import Any

from ...dtypes import is_floating
from .conv import conv_out_size, window_slice
from .scatter import scatter_add

Array = Any
Pair = tuple[int, int]
Shape = tuple[int, ...]


def _pool_geometry(op: str, x_shape: Shape, kernel: Pair, stride: Pair,
                   padding: Pair) -> Pair:
    """Validate a pooling call and return the output size (Ho, Wo)."""
    if len(x_shape) != 4:
        raise ValueError(f"{op}: expected x [N, C, H, W], got shape {tuple(x_shape)}")
    if any(p > k // 2 for p, k in zip(padding, kernel)):
        raise ValueError(f"{op}: padding {padding} must be at most half the kernel "
                         f"{kernel}")
    return (conv_out_size(op, x_shape[2], kernel[0], stride[0], padding[0], 1),
            conv_out_size(op, x_shape[3], kernel[1], stride[1], padding[1], 1))


class NumpyPoolKernels:
    """max_pool2d / avg_pool2d and their backward passes for any NumPy-like ``xp``."""

    xp: Any

    def _tap_plane_index(self, out_hw: Pair, stride: Pair, padding: Pair, tap: Pair,
                         width: int) -> Array:
        """Flat index into the input's H*W plane read by kernel tap (i, j), per output
        position, as an int64 [Ho, Wo] array (it may point into the padding)."""
        xp = self.xp
        rows = xp.arange(out_hw[0], dtype=xp.int64) * stride[0] - padding[0] + tap[0]
        cols = xp.arange(out_hw[1], dtype=xp.int64) * stride[1] - padding[1] + tap[1]
        return rows[:, None] * width + cols[None, :]

    def max_pool2d(self, x: Array, kernel: Pair, stride: Pair,
                   padding: Pair) -> tuple[Array, Array]:
        """Returns (out, argmax) where argmax is the flat index into each H*W plane.

        Like PyTorch: the first maximum wins, NaN propagates, and a window holding only
        -inf reports its first position inside the image.
        """
        xp = self.xp
        ho, wo = _pool_geometry("max_pool2d", x.shape, kernel, stride, padding)
        if not is_floating(x.dtype):
            raise TypeError(f"max_pool2d: expected a floating input, got {x.dtype}")
        n, c, h, w = x.shape
        (ph, pw), (sh, sw) = padding, stride
        xpad = xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-xp.inf)
        best = xp.full((n, c, ho, wo), -xp.inf, dtype=x.dtype)
        first_inside = (xp.maximum(xp.arange(ho) * sh - ph, 0)[:, None] * w
                        + xp.maximum(xp.arange(wo) * sw - pw, 0)[None, :])
        argmax = xp.empty(best.shape, dtype=xp.int64)
        argmax[...] = first_inside
        for i in range(kernel[0]):
            rows = window_slice(i, 1, sh, ho)
            for j in range(kernel[1]):
                v = xpad[:, :, rows, window_slice(j, 1, sw, wo)]
                take = v > best
                take |= xp.isnan(v)
                xp.copyto(best, v, where=take)
                tap = self._tap_plane_index((ho, wo), stride, padding, (i, j), w)
                xp.copyto(argmax, xp.broadcast_to(tap, argmax.shape), where=take)
        return best, argmax

    def max_pool2d_backward(self, grad: Array, argmax: Array, x_shape: Shape) -> Array:
        """Route each output gradient to the input position its argmax names.

        Overlapping windows may share a maximum; their gradients add up.
        """
        xp = self.xp
        n, c, h, w = x_shape
        ho, wo = grad.shape[2], grad.shape[3]
        if argmax.shape != grad.shape:
            raise ValueError(f"max_pool2d_backward: argmax shape {argmax.shape} differs "
                             f"from grad shape {grad.shape}")
        dx = xp.zeros((n, c, h * w), dtype=grad.dtype)
        flat_grad = grad.reshape(n, c, ho * wo)
        flat_arg = argmax.reshape(n, c, ho * wo)
        plane_start = xp.arange(n * c, dtype=xp.int64).reshape(n, c, 1) * (h * w)
        scatter_add(xp, dx.reshape(-1), (plane_start + flat_arg).reshape(-1),
                    flat_grad.reshape(-1))
        return dx.reshape(x_shape)

    def avg_pool2d(self, x: Array, kernel: Pair, stride: Pair, padding: Pair) -> Array:
        """Zero padding counted in the divisor (PyTorch's count_include_pad=True)."""
        xp = self.xp
        ho, wo = _pool_geometry("avg_pool2d", x.shape, kernel, stride, padding)
        (ph, pw), (sh, sw) = padding, stride
        xpad = xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        total = xp.zeros(x.shape[:2] + (ho, wo), dtype=x.dtype)
        for i in range(kernel[0]):
            rows = window_slice(i, 1, sh, ho)
            for j in range(kernel[1]):
                total += xpad[:, :, rows, window_slice(j, 1, sw, wo)]
        return total / (kernel[0] * kernel[1])

    def avg_pool2d_backward(self, grad: Array, x_shape: Shape, kernel: Pair,
                            stride: Pair, padding: Pair) -> Array:
        """Spread each output gradient evenly over its window (padding included)."""
        xp = self.xp
        ho, wo = _pool_geometry("avg_pool2d_backward", x_shape, kernel, stride, padding)
        n, c, h, w = x_shape
        (ph, pw), (sh, sw) = padding, stride
        share = grad / (kernel[0] * kernel[1])
        dx = xp.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=grad.dtype)
        for i in range(kernel[0]):
            rows = window_slice(i, 1, sh, ho)
            for j in range(kernel[1]):
                dx[:, :, rows, window_slice(j, 1, sw, wo)] += share
        return xp.ascontiguousarray(dx[:, :, ph:ph + h, pw:pw + w])
