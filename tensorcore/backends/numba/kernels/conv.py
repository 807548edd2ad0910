"""im2col / col2im for 2-D convolution (NCHW); the matrix products are BLAS calls
made by the backend.

The column matrix is laid out [C, kh, kw, N, Ho*Wo], i.e. [groups, K, N*Ho*Wo] with
K = C/groups * kh * kw, so the forward, the input gradient and the weight gradient
are each one large GEMM per group.  ``im2col_`` fills a caller-owned buffer: the
column matrix is the largest temporary of a convolution, and reusing it spares the
page faults of a fresh allocation (which parallel threads take slowly).

One row of the column matrix holds one tap (a, b) of one channel for every output
position.  With stride 1 and Wo == W (a "same"-width convolution such as 3x3 with
padding 1), output position p of a tap reads input position p + offset of the
flattened plane, so the row is one contiguous shifted copy of the plane, after which
the positions whose tap falls in the padding are zeroed.  Other geometries copy row
by row.  col2im runs one (channel, image) plane per task, so no two threads add into
the same element.  For small planes of unchanged size, ``im2col_same_`` /
``col2im_same_`` work on the channel-major layout [C, N, H, W], where a tap's row is
one shifted copy across all N planes (``col2im_same_`` writes its result in NCHW order).

``unswap_bias_act`` puts a forward product [Cout, N, Ho*Wo] into NCHW order with the
bias and activation applied on the way.  ``small_k_forward_`` / ``small_k_weight_grad``
replace the BLAS products when the contraction C/groups * kh * kw is short (a first
layer on 1-3 input channels).
"""

from __future__ import annotations

import numpy as np

from .activations import act_row
from .jit import helper, kernel
from .lanes import DOT, lane_sum
from .parallel import parallel_for


@helper
def _valid_outputs(tap, dilation, stride, pad, in_size, out_size):
    """[lo, hi): the outputs whose input position ``o*stride - pad + tap*dilation``
    lies inside [0, in_size)."""
    shift = tap * dilation - pad
    lo = min(max(-(shift // stride), 0), out_size)  # ceil(-shift / stride)
    last = in_size - 1 - shift
    hi = last // stride + 1 if last >= 0 else 0
    return lo, max(min(hi, out_size), lo)


@helper
def _shifted_span(offset, in_size, out_lo, out_hi):
    """[lo, hi) within [out_lo, out_hi): the output positions p of a flat shifted copy
    whose input position p + offset lies inside [0, in_size)."""
    lo = max(out_lo, -offset)
    return lo, max(min(out_hi, in_size - offset), lo)


@helper
def _zero_padding_reads(row, ho, wo, oh_lo, oh_hi, ow_lo, ow_hi):
    """Zero the entries of ``row``, one or more flat output planes [Ho*Wo] back to
    back, outside rows [oh_lo, oh_hi) x columns [ow_lo, ow_hi): the positions where
    the tap reads padding."""
    t = row.dtype.type
    plane = ho * wo
    for start in range(0, row.size, plane):
        for p in range(start, start + oh_lo * wo):
            row[p] = t(0.0)
        for p in range(start + oh_hi * wo, start + plane):
            row[p] = t(0.0)
    for col in range(ow_lo):
        for r in range(row.size // wo):
            row[r * wo + col] = t(0.0)
    for col in range(ow_hi, wo):
        for r in range(row.size // wo):
            row[r * wo + col] = t(0.0)


@helper
def _im2col_row(task, cols, x, sh, sw, ph, pw, dh, dw, ho, wo, n, h, w, kh, kw, shifted):
    """Fill the (channel, tap) row ``task`` of ``im2col_``'s columns."""
    ch, a, b = task // (kh * kw), task // kw % kh, task % kw
    oh_lo, oh_hi = _valid_outputs(a, dh, sh, ph, h, ho)
    ow_lo, ow_hi = _valid_outputs(b, dw, sw, pw, w, wo)
    offset = (a * dh - ph) * w + b * dw - pw
    lo, hi = _shifted_span(offset, h * w, oh_lo * wo, oh_hi * wo)
    col_shift = b * dw - pw
    for i in range(n):
        dst = cols[ch, a, b, i]
        if shifted:
            src = x[i, ch].reshape(-1)[lo + offset:hi + offset]
            part = dst[lo:hi]
            for p in range(part.size):
                part[p] = src[p]
        else:
            for oh in range(oh_lo, oh_hi):
                src_row = x[i, ch, oh * sh - ph + a * dh, ow_lo * sw + col_shift::sw]
                dst_row = dst[oh * wo + ow_lo:oh * wo + ow_hi]
                for ow in range(dst_row.size):
                    dst_row[ow] = src_row[ow]
        _zero_padding_reads(dst, ho, wo, oh_lo, oh_hi, ow_lo, ow_hi)


@kernel
def im2col_(cols, x, sh, sw, ph, pw, dh, dw, ho, wo):
    """Fill ``cols`` [C, kh, kw, N, Ho*Wo] with the taps of x [N, C, H, W], zero where
    a tap reads padding.  One task per (channel, tap) row."""
    n, c, h, w = x.shape
    kh, kw = cols.shape[1], cols.shape[2]
    shifted = sh == 1 and sw == 1 and wo == w
    parallel_for(_im2col_row, c * kh * kw,
                 (cols, x, sh, sw, ph, pw, dh, dw, ho, wo, n, h, w, kh, kw, shifted))


@helper
def _col2im_plane(task, cols, dx, h, w, sh, sw, ph, pw, dh, dw, ho, wo, n, kh, kw, shifted):
    """Sum the taps of the (channel, image) plane ``task`` of ``col2im_``'s result."""
    t = cols.dtype.type
    ch, i = task // n, task % n
    plane = dx[i, ch].reshape(-1)
    for q in range(plane.size):
        plane[q] = t(0.0)
    for a in range(kh):
        oh_lo, oh_hi = _valid_outputs(a, dh, sh, ph, h, ho)
        for b in range(kw):
            ow_lo, ow_hi = _valid_outputs(b, dw, sw, pw, w, wo)
            src = cols[ch, a, b, i]
            if shifted:
                _zero_padding_reads(src, ho, wo, oh_lo, oh_hi, ow_lo, ow_hi)
                offset = (a * dh - ph) * w + b * dw - pw
                lo, hi = _shifted_span(offset, h * w, oh_lo * wo, oh_hi * wo)
                part, dst = src[lo:hi], plane[lo + offset:hi + offset]
                for p in range(part.size):
                    dst[p] += part[p]
            else:
                col_shift = b * dw - pw
                for oh in range(oh_lo, oh_hi):
                    dst_row = dx[i, ch, oh * sh - ph + a * dh, ow_lo * sw + col_shift::sw]
                    src_row = src[oh * wo + ow_lo:oh * wo + ow_hi]
                    for ow in range(src_row.size):
                        dst_row[ow] += src_row[ow]


@kernel
def col2im_(dx, cols, sh, sw, ph, pw, dh, dw, ho, wo):
    """Adjoint of ``im2col_``: columns [C, kh, kw, N, Ho*Wo] -> dx [N, C, H, W]
    (C-contiguous), adding every tap's value into the input position it read.
    Overwrites the entries of ``cols`` whose tap reads padding with zeros."""
    c, kh, kw, n, _ = cols.shape
    h, w = dx.shape[2], dx.shape[3]
    shifted = sh == 1 and sw == 1 and wo == w
    parallel_for(_col2im_plane, c * n, (cols, dx, h, w, sh, sw, ph, pw, dh, dw, ho, wo, n, kh, kw, shifted))


@helper
def _im2col_same_row(task, cols, x_cm, ph, pw, dh, dw, h, w, kh, kw, size):
    """Fill the (channel, tap) row ``task`` of ``im2col_same_``'s columns."""
    t = x_cm.dtype.type
    ch, a, b = task // (kh * kw), task // kw % kh, task % kw
    oh_lo, oh_hi = _valid_outputs(a, dh, 1, ph, h, h)
    ow_lo, ow_hi = _valid_outputs(b, dw, 1, pw, w, w)
    offset = (a * dh - ph) * w + b * dw - pw
    lo, hi = _shifted_span(offset, size, 0, size)
    dst = cols[ch, a, b].reshape(-1)
    src, part = x_cm[ch].reshape(-1)[lo + offset:hi + offset], dst[lo:hi]
    for q in range(part.size):
        part[q] = src[q]
    for q in range(lo):
        dst[q] = t(0.0)
    for q in range(hi, size):
        dst[q] = t(0.0)
    _zero_padding_reads(dst, h, w, oh_lo, oh_hi, ow_lo, ow_hi)


@kernel
def im2col_same_(cols, x_cm, ph, pw, dh, dw):
    """``im2col_`` for stride 1 and an output plane the size of the input plane, from
    channel-major x_cm [C, N, H, W]: each (channel, tap) row of ``cols`` is then one
    shifted copy of the channel's N planes back to back (the values that spill across
    plane edges all sit where the tap reads padding, and are zeroed).  For small
    planes this beats ``im2col_``'s copy per plane, layout swap included."""
    c, n, h, w = x_cm.shape
    kh, kw = cols.shape[1], cols.shape[2]
    size = n * h * w
    parallel_for(_im2col_same_row, c * kh * kw, (cols, x_cm, ph, pw, dh, dw, h, w, kh, kw, size))


@helper
def _col2im_same_channel(ch, cols, dx, n, h, w, ph, pw, dh, dw, kh, kw, plane, size):
    """Sum the taps of channel ``ch`` of ``col2im_same_``'s result."""
    acc = np.zeros(size, dtype=cols.dtype)
    for a in range(kh):
        oh_lo, oh_hi = _valid_outputs(a, dh, 1, ph, h, h)
        for b in range(kw):
            ow_lo, ow_hi = _valid_outputs(b, dw, 1, pw, w, w)
            src = cols[ch, a, b].reshape(-1)
            _zero_padding_reads(src, h, w, oh_lo, oh_hi, ow_lo, ow_hi)
            offset = (a * dh - ph) * w + b * dw - pw
            lo, hi = _shifted_span(offset, size, 0, size)
            part, dst = src[lo:hi], acc[lo + offset:hi + offset]
            for q in range(part.size):
                dst[q] += part[q]
    for i in range(n):
        res, part = dx[i, ch].reshape(-1), acc[i * plane:(i + 1) * plane]
        for q in range(plane):
            res[q] = part[q]


@kernel
def col2im_same_(dx, cols, ph, pw, dh, dw):
    """Adjoint of ``im2col_same_``: columns [C, kh, kw, N, H*W] -> dx [N, C, H, W]
    (C-contiguous), one channel per task, which sums its N planes back to back
    (channel-major, in its own buffer) and then writes them out in NCHW order.
    Overwrites the entries of ``cols`` whose tap reads padding with zeros."""
    c, kh, kw = cols.shape[:3]
    n, h, w = dx.shape[0], dx.shape[2], dx.shape[3]
    plane = h * w
    size = n * plane
    parallel_for(_col2im_same_channel, c, (cols, dx, n, h, w, ph, pw, dh, dw, kh, kw, plane, size))


@helper
def _swap_copy_row(j, src, dst, a, inner):
    """dst[j, i] = src[i, j] for every i: index ``j`` of ``swap_leading_axes``."""
    for i in range(a):
        s, d = src[i, j], dst[j, i]
        for k in range(inner):
            d[k] = s[k]


@kernel
def swap_leading_axes(x):
    """Contiguous [A, B, *rest] -> contiguous [B, A, *rest] (a parallel copy, one task
    per index of B)."""
    a, b = x.shape[0], x.shape[1]
    out = np.empty((b, a) + x.shape[2:], dtype=x.dtype)
    if out.size == 0:
        return out
    inner = x.size // (a * b)
    src, dst = x.reshape(a, b, inner), out.reshape(b, a, inner)
    parallel_for(_swap_copy_row, b, (src, dst, a, inner))
    return out


@helper
def _unswap_channel(co, y, bias, code, out, n):
    """Output channel ``co`` of ``unswap_bias_act``."""
    t = y.dtype.type
    shift = bias[co]
    for i in range(n):
        act_row(code, y[co, i], t(1.0), shift, out[i, co])


@kernel
def unswap_bias_act(y, bias, code):
    """act(y + bias) for a GEMM's product y [Cout, N, S], written in NCHW order
    [N, Cout, S]: the layout swap with the convolution's epilogue on the way.  One
    output channel per task (small planes make short rows: a task per row would
    spend more on its index arithmetic than on the row)."""
    cout, n, s = y.shape
    out = np.empty((n, cout, s), dtype=y.dtype)
    parallel_for(_unswap_channel, cout, (y, bias, code, out, n))
    return out


BLOCK = 4096  # values of one output channel that a small-K task keeps in L1


@helper
def _image_blocks(n, hw):
    """(images per block, blocks): image blocks of at most BLOCK values of a plane."""
    per = max(1, BLOCK // max(hw, 1))
    return per, (n + per - 1) // per


@helper
def _small_k_block(task, y, w, flat, bias, code, n, hw, cg, k, per, blocks):
    """The (output channel, block of images) ``task`` of ``small_k_forward_``."""
    t = flat.dtype.type
    co, blk = task // blocks, task % blocks
    g, cj = co // cg, co % cg
    i0, i1 = blk * per, min(n, (blk + 1) * per)
    lo, size = i0 * hw, (i1 - i0) * hw
    acc = np.empty(size, dtype=flat.dtype)
    w0, src = w[g, cj, 0], flat[g, 0, lo:lo + size]
    for p in range(size):
        acc[p] = w0 * src[p]
    for kk in range(1, k):
        wk, src = w[g, cj, kk], flat[g, kk, lo:lo + size]
        for p in range(size):
            acc[p] += wk * src[p]
    for i in range(i0, i1):
        act_row(code, acc[(i - i0) * hw:(i - i0 + 1) * hw], t(1.0), bias[co], y[i, co])


@kernel
def small_k_forward_(y, w, cols, bias, code):
    """y [N, Cout, Ho*Wo] = act(w @ cols + bias) per group, for w [groups, Cout/groups, K]
    and cols [groups, K, N, Ho*Wo], written straight into NCHW order.  For a short
    contraction (a first layer's few input channels) the product is memory-bound: one
    task per (output channel, block of images) accumulates the block, contiguous in
    cols, in L1 with long vector loops, then writes it out with the epilogue; this
    beats a BLAS call plus the NCHW reordering.  The output is an argument so that it
    counts in the kernel's size: it is K/Cout times the inputs' (``SizedKernel``)."""
    groups, cg, k = w.shape
    n, hw = cols.shape[2], cols.shape[3]
    flat = cols.reshape(groups, k, n * hw)
    per, blocks = _image_blocks(n, hw)
    parallel_for(_small_k_block, groups * cg * blocks, (y, w, flat, bias, code, n, hw, cg, k, per, blocks))


@helper
def _small_k_channel_grad(co, grad, flat, dw, n, hw, cg, k, per, blocks):
    """Output channel ``co`` of ``small_k_weight_grad``."""
    t = flat.dtype.type
    g, cj = co // cg, co % cg
    sums = np.zeros(k, dtype=flat.dtype)
    block = np.empty(per * hw, dtype=flat.dtype)
    for blk in range(blocks):
        i0, i1 = blk * per, min(n, (blk + 1) * per)
        lo, size = i0 * hw, (i1 - i0) * hw
        for i in range(i0, i1):
            plane, part = grad[i, co], block[(i - i0) * hw:(i - i0 + 1) * hw]
            for p in range(hw):
                part[p] = plane[p]
        for kk in range(k):
            src = flat[g, kk, lo:lo + size]
            sums[kk] += lane_sum(DOT, block[:size], src, t(0.0))
    for kk in range(k):
        dw[g, cj, kk] = sums[kk]


@kernel
def small_k_weight_grad(grad, cols):
    """dw [groups, Cout/groups, K] = grad @ cols^T per group, from grad [N, Cout, Ho*Wo]
    and cols [groups, K, N, Ho*Wo]: the adjoint of ``small_k_forward_`` in the weight.
    One output channel per task: it gathers its gradient planes a block of images at a
    time (contiguous, in L1), then takes K long dot products with cols."""
    groups, k, n, hw = cols.shape
    cout = grad.shape[1]
    cg = cout // groups
    dw = np.empty((groups, cg, k), dtype=cols.dtype)
    flat = cols.reshape(groups, k, n * hw)
    per, blocks = _image_blocks(n, hw)
    parallel_for(_small_k_channel_grad, cout, (grad, flat, dw, n, hw, cg, k, per, blocks))
    return dw
