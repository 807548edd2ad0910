"""im2col / col2im for 2-D convolution (NCHW); the matrix products are BLAS calls
made by the backend.

The column matrix is laid out [C, kh, kw, N, Ho*Wo], i.e. [groups, K, N*Ho*Wo] with
K = C/groups * kh * kw, so the forward, the input gradient and the weight gradient
are each one large GEMM per group.  Both kernels run one (channel, image) plane per
task: col2im then writes only its own input plane, so no two threads add into the
same element.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .jit import helper, kernel


@helper
def _valid_outputs(tap, dilation, stride, pad, in_size, out_size):
    """[lo, hi): the outputs whose input position ``o*stride - pad + tap*dilation``
    lies inside [0, in_size)."""
    shift = tap * dilation - pad
    lo = min(max(-(shift // stride), 0), out_size)  # ceil(-shift / stride)
    last = in_size - 1 - shift
    hi = last // stride + 1 if last >= 0 else 0
    return lo, max(min(hi, out_size), lo)


@kernel
def im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo):
    """x [N, C, H, W] -> columns [C, kh, kw, N, Ho*Wo], zero where a tap reads padding."""
    n, c, h, w = x.shape
    cols = np.empty((c, kh, kw, n, ho * wo), dtype=x.dtype)
    for task in prange(c * n):
        ch, i = task // n, task % n
        src = x[i, ch]
        for a in range(kh):
            oh_lo, oh_hi = _valid_outputs(a, dh, sh, ph, h, ho)
            for b in range(kw):
                ow_lo, ow_hi = _valid_outputs(b, dw, sw, pw, w, wo)
                dst = cols[ch, a, b, i]
                dst[:oh_lo * wo] = 0
                dst[oh_hi * wo:] = 0
                shift = b * dw - pw
                for oh in range(oh_lo, oh_hi):
                    row = src[oh * sh - ph + a * dh]
                    out = dst[oh * wo:(oh + 1) * wo]
                    out[:ow_lo] = 0
                    out[ow_hi:] = 0
                    for ow in range(ow_lo, ow_hi):
                        out[ow] = row[ow * sw + shift]
    return cols


@kernel
def col2im(cols, h, w, sh, sw, ph, pw, dh, dw, ho, wo):
    """Adjoint of ``im2col``: columns [C, kh, kw, N, Ho*Wo] -> x-shaped [N, C, H, W],
    adding every tap's value into the input position it read."""
    c, kh, kw, n, _ = cols.shape
    dx = np.zeros((n, c, h, w), dtype=cols.dtype)
    for task in prange(c * n):
        ch, i = task // n, task % n
        dst = dx[i, ch]
        for a in range(kh):
            oh_lo, oh_hi = _valid_outputs(a, dh, sh, ph, h, ho)
            for b in range(kw):
                ow_lo, ow_hi = _valid_outputs(b, dw, sw, pw, w, wo)
                src = cols[ch, a, b, i]
                shift = b * dw - pw
                for oh in range(oh_lo, oh_hi):
                    row = dst[oh * sh - ph + a * dh]
                    vals = src[oh * wo:(oh + 1) * wo]
                    for ow in range(ow_lo, ow_hi):
                        row[ow * sw + shift] += vals[ow]
    return dx


@kernel
def swap_leading_axes(x):
    """[A, B, *rest] -> contiguous [B, A, *rest] (a parallel copy)."""
    a, b = x.shape[0], x.shape[1]
    out = np.empty((b, a) + x.shape[2:], dtype=x.dtype)
    for task in prange(a * b):
        i, j = task // b, task % b
        out[j, i] = x[i, j]
    return out
