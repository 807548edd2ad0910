"""im2col / col2im for 2-D convolution (NCHW); the matrix products are BLAS calls
made by the backend.

The column matrix is laid out [C, kh, kw, N, Ho*Wo], i.e. [groups, K, N*Ho*Wo] with
K = C/groups * kh * kw, so the forward, the input gradient and the weight gradient
are each one large GEMM per group.  ``im2col_`` fills a caller-owned buffer: the
column matrix is the largest temporary of a convolution, and reusing it spares the
page faults of a fresh allocation (which parallel threads take slowly).  Both
kernels run one (channel, image) plane per task: col2im then writes only its own
input plane, so no two threads add into the same element.
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
def im2col_(cols, x, sh, sw, ph, pw, dh, dw, ho, wo):
    """Fill ``cols`` [C, kh, kw, N, Ho*Wo] with the taps of x [N, C, H, W], zero where
    a tap reads padding."""
    n, c, h, w = x.shape
    kh, kw = cols.shape[1], cols.shape[2]
    t = x.dtype.type
    for task in prange(c * n):
        ch, i = task // n, task % n
        for a in range(kh):
            oh_lo, oh_hi = _valid_outputs(a, dh, sh, ph, h, ho)
            for b in range(kw):
                ow_lo, ow_hi = _valid_outputs(b, dw, sw, pw, w, wo)
                shift = b * dw - pw
                for oh in range(ho):
                    base = oh * wo
                    if oh < oh_lo or oh >= oh_hi:
                        for ow in range(wo):
                            cols[ch, a, b, i, base + ow] = t(0.0)
                        continue
                    ih = oh * sh - ph + a * dh
                    for ow in range(ow_lo):
                        cols[ch, a, b, i, base + ow] = t(0.0)
                    for ow in range(ow_lo, ow_hi):
                        cols[ch, a, b, i, base + ow] = x[i, ch, ih, ow * sw + shift]
                    for ow in range(ow_hi, wo):
                        cols[ch, a, b, i, base + ow] = t(0.0)


@kernel
def col2im(cols, h, w, sh, sw, ph, pw, dh, dw, ho, wo):
    """Adjoint of ``im2col``: columns [C, kh, kw, N, Ho*Wo] -> x-shaped [N, C, H, W],
    adding every tap's value into the input position it read."""
    c, kh, kw, n, _ = cols.shape
    dx = np.zeros((n, c, h, w), dtype=cols.dtype)
    for task in prange(c * n):
        ch, i = task // n, task % n
        for a in range(kh):
            oh_lo, oh_hi = _valid_outputs(a, dh, sh, ph, h, ho)
            for b in range(kw):
                ow_lo, ow_hi = _valid_outputs(b, dw, sw, pw, w, wo)
                shift = b * dw - pw
                for oh in range(oh_lo, oh_hi):
                    ih = oh * sh - ph + a * dh
                    base = oh * wo
                    for ow in range(ow_lo, ow_hi):
                        dx[i, ch, ih, ow * sw + shift] += cols[ch, a, b, i, base + ow]
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
