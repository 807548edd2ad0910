"""Nearest and bilinear upsampling (NCHW) with PyTorch's index conventions.

Both resamplings are separable: along each axis, output position ``d`` reads a fixed
set of input positions.  Nearest gathers rows then columns; its backward and both
bilinear directions multiply by the small per-axis interpolation matrices
``A`` [out, in] (``out = A_h @ x @ A_wᵀ``, ``dx = A_hᵀ @ grad @ A_w``), which is exact,
deterministic and needs no scatter.
"""

from __future__ import annotations

from typing import Any

Array = Any
Pair = tuple[int, int]
Shape = tuple[int, ...]


def check_image(op: str, shape: Shape, out_hw: Pair | None = None) -> None:
    if len(shape) != 4:
        raise ValueError(f"{op}: expected [N, C, H, W], got shape {tuple(shape)}")
    if out_hw is not None and (len(out_hw) != 2 or min(out_hw) < 1):
        raise ValueError(f"{op}: output size must be two positive ints, got {out_hw}")


class NumpyUpsampleKernels:
    """upsample_nearest2d / upsample_bilinear2d and their backward passes."""

    xp: Any

    def _nearest_source(self, in_size: int, out_size: int) -> Array:
        """Input index read by each output index: min(floor(d * in/out), in - 1).

        Evaluated in float32 like PyTorch's ``nearest_idx``, so rounding agrees too
        (95 * 21/133 gives 14 there, not the exact 15).
        """
        xp = self.xp
        scale = xp.float32(in_size) / xp.float32(out_size)
        src = xp.floor(xp.arange(out_size, dtype=xp.float32) * scale).astype(xp.int64)
        return xp.minimum(src, in_size - 1)

    def _one_hot(self, index: Array, in_size: int, dtype: Any) -> Array:
        """[len(index), in_size] matrix with a 1 at (d, index[d])."""
        xp = self.xp
        return (index[:, None] == xp.arange(in_size)[None, :]).astype(dtype)

    def _bilinear_matrix(self, in_size: int, out_size: int, align_corners: bool,
                         dtype: Any) -> Array:
        """[out, in] linear interpolation weights, PyTorch's source-index rule."""
        xp = self.xp
        dst = xp.arange(out_size, dtype=xp.float64)
        if align_corners:
            scale = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
            src = dst * scale
        else:
            src = xp.maximum((dst + 0.5) * (in_size / out_size) - 0.5, 0.0)
        lo = xp.minimum(xp.floor(src).astype(xp.int64), in_size - 1)
        hi = xp.minimum(lo + 1, in_size - 1)
        frac = xp.clip(src - lo, 0.0, 1.0)[:, None]
        weights = (1.0 - frac) * self._one_hot(lo, in_size, xp.float64)
        weights = weights + frac * self._one_hot(hi, in_size, xp.float64)
        return weights.astype(dtype)

    def _apply_separable(self, a_h: Array, x: Array, a_w: Array) -> Array:
        """a_h @ x @ a_wᵀ over the last two axes of x."""
        xp = self.xp
        return xp.ascontiguousarray(xp.matmul(a_h, xp.matmul(x, a_w.T)))

    def upsample_nearest2d(self, x: Array, out_hw: Pair) -> Array:
        """out[..., d_h, d_w] = x[..., floor(d_h * H/Ho), floor(d_w * W/Wo)]."""
        xp = self.xp
        check_image("upsample_nearest2d", x.shape, out_hw)
        rows = self._nearest_source(x.shape[2], out_hw[0])
        cols = self._nearest_source(x.shape[3], out_hw[1])
        return xp.take(xp.take(x, rows, axis=2), cols, axis=3)

    def upsample_nearest2d_backward(self, grad: Array, x_shape: Shape) -> Array:
        """Sum the gradients of every output that copied a given input."""
        check_image("upsample_nearest2d_backward", x_shape)
        ho, wo = grad.shape[2], grad.shape[3]
        rows = self._nearest_source(x_shape[2], ho)
        cols = self._nearest_source(x_shape[3], wo)
        a_h = self._one_hot(rows, x_shape[2], grad.dtype)
        a_w = self._one_hot(cols, x_shape[3], grad.dtype)
        return self._apply_separable(a_h.T, grad, a_w.T)

    def upsample_bilinear2d(self, x: Array, out_hw: Pair, align_corners: bool) -> Array:
        """Bilinear resampling to ``out_hw`` (PyTorch semantics for both corner modes)."""
        check_image("upsample_bilinear2d", x.shape, out_hw)
        a_h = self._bilinear_matrix(x.shape[2], out_hw[0], align_corners, x.dtype)
        a_w = self._bilinear_matrix(x.shape[3], out_hw[1], align_corners, x.dtype)
        return self._apply_separable(a_h, x, a_w)

    def upsample_bilinear2d_backward(self, grad: Array, x_shape: Shape,
                                     align_corners: bool) -> Array:
        """Transpose of the bilinear resampling."""
        check_image("upsample_bilinear2d_backward", x_shape)
        ho, wo = grad.shape[2], grad.shape[3]
        a_h = self._bilinear_matrix(x_shape[2], ho, align_corners, grad.dtype)
        a_w = self._bilinear_matrix(x_shape[3], wo, align_corners, grad.dtype)
        return self._apply_separable(a_h.T, grad, a_w.T)
