"""Direct 2-D convolution loops (NCHW) for thin convolutions: few output channels per
group, such as a network's last layer (w [1, 32, 3, 3]).

There im2col + GEMM is a matrix-vector product: the column matrix, kh*kw times the
size of the input, costs far more to write and read than the arithmetic, and with
one output channel the input gradient's product (an outer product written through a
transposed view) runs in NumPy without BLAS.  These kernels keep no column matrix:
each task accumulates a block of planes, one tap at a time.

A block holds the planes of a few consecutive images of one channel back to back,
each padded: Hp x Wp = (H + 2*ph) x (W + 2*pw) values, zeros in the padding, so no
tap reads out of bounds.  Output planes are laid out in the same grid (the output
(oh, ow) at row oh, column ow of its image's Hp x Wp plane, the rest unused).  With
stride 1, tap (a, b) then maps every output position q of the block to the input
position q + a*dh*Wp + b*dw, and a tap over the whole block is one long contiguous
loop; the unused positions take stray values (forward) or hold zeros (gradients)
and are never read back.  Other strides loop row by row.
"""

from __future__ import annotations

import numpy as np

from .activations import act_row
from .jit import helper, inlined, kernel
from .lanes import DOT, lane_sum
from .parallel import parallel_for

BLOCK = 2048  # padded values per block of planes: long loops, still in L1


@helper
def _blocks(n, plane):
    """(images per block, blocks): blocks of at most BLOCK values of padded planes."""
    per = max(1, BLOCK // plane)
    return per, (n + per - 1) // per


@inlined
def _pad_planes(src, i0, i1, ch, top, left, pitch, plane, dst):
    """dst = src[i0:i1, ch] as a block: each plane at row ``top``, column ``left`` of
    its ``plane`` values with rows of ``pitch``, zeros elsewhere."""
    t = dst.dtype.type
    h, w = src.shape[2], src.shape[3]
    for q in range((i1 - i0) * plane):
        dst[q] = t(0.0)
    for i in range(i0, i1):
        for r in range(h):
            start = (i - i0) * plane + (top + r) * pitch + left
            row, out = src[i, ch, r], dst[start:start + w]
            for j in range(w):
                out[j] = row[j]


@inlined
def _gather_tap(acc, src, wv, offset, count, sh, sw, pitch, plane, ho, wo):
    """acc[q] += wv * src[q's input position] over the output positions q of a block of
    ``count`` planes, for the tap reading input q + offset at stride 1."""
    if sh == 1 and sw == 1:
        span = (count - 1) * plane + (ho - 1) * pitch + wo
        out, inp = acc[:span], src[offset:offset + span]
        for q in range(span):
            out[q] += wv * inp[q]
        return
    for k in range(count):
        for oh in range(ho):
            o, s = k * plane + oh * pitch, k * plane + oh * sh * pitch + offset
            for ow in range(wo):
                acc[o + ow] += wv * src[s + ow * sw]


@inlined
def _scatter_tap(acc, src, wv, offset, count, sh, sw, pitch, plane, ho, wo):
    """Adjoint of ``_gather_tap``: acc[q's input position] += wv * src[q]."""
    if sh == 1 and sw == 1:
        span = (count - 1) * plane + (ho - 1) * pitch + wo
        out, inp = acc[offset:offset + span], src[:span]
        for q in range(span):
            out[q] += wv * inp[q]
        return
    for k in range(count):
        for oh in range(ho):
            o, s = k * plane + oh * pitch, k * plane + oh * sh * pitch + offset
            for ow in range(wo):
                acc[s + ow * sw] += wv * src[o + ow]


@inlined
def _tap_dot(grad, src, offset, count, sh, sw, pitch, plane, ho, wo):
    """The sum of grad[q] * src[q's input position] over a block's output positions."""
    t = grad.dtype.type
    total = t(0.0)
    if sh == 1 and sw == 1:
        span = (count - 1) * plane + (ho - 1) * pitch + wo
        return lane_sum(DOT, grad[:span], src[offset:offset + span], t(0.0))
    for k in range(count):
        for oh in range(ho):
            o, s = k * plane + oh * pitch, k * plane + oh * sh * pitch + offset
            for ow in range(wo):
                total += grad[o + ow] * src[s + ow * sw]
    return total


@helper
def _forward_block(task, y, x, w, bias, code, sh, sw, ph, pw, dh, dw, n, cg, kh, kw, ho, wo, per_group,
                   pitch, plane, per, blocks):
    """The (output channel, block of images) ``task`` of ``forward_``."""
    t = y.dtype.type
    co, blk = task // blocks, task % blocks
    i0, i1 = blk * per, min(n, (blk + 1) * per)
    ch0 = co // per_group * cg
    acc = np.zeros((i1 - i0) * plane, dtype=y.dtype)
    src = np.empty((i1 - i0) * plane, dtype=y.dtype)
    for cj in range(cg):
        _pad_planes(x, i0, i1, ch0 + cj, ph, pw, pitch, plane, src)
        for a in range(kh):
            for b in range(kw):
                _gather_tap(acc, src, w[co, cj, a, b], a * dh * pitch + b * dw, i1 - i0,
                            sh, sw, pitch, plane, ho, wo)
    for i in range(i0, i1):
        out = acc[(i - i0) * ho * wo:(i - i0 + 1) * ho * wo]
        for oh in range(ho):  # in place: every value moves down or stays
            for ow in range(wo):
                out[oh * wo + ow] = acc[(i - i0) * plane + oh * pitch + ow]
        act_row(code, out, t(1.0), bias[co], y[i, co].reshape(-1))


@kernel
def forward_(y, x, w, bias, code, sh, sw, ph, pw, dh, dw):
    """y [N, Cout, Ho, Wo] = act(conv(x, w) + bias), one task per (output channel,
    block of images): each input channel of the group is padded into a block, then
    every tap adds it, shifted and weighted, into the block's accumulator; the
    epilogue writes each plane's Ho x Wo outputs into y."""
    n, c, h, width = x.shape
    cout, cg, kh, kw = w.shape
    ho, wo = y.shape[2], y.shape[3]
    per_group = cout // (c // cg)
    pitch = width + 2 * pw
    plane = (h + 2 * ph) * pitch
    per, blocks = _blocks(n, plane)
    parallel_for(_forward_block, cout * blocks,
                 (y, x, w, bias, code, sh, sw, ph, pw, dh, dw, n, cg, kh, kw, ho, wo, per_group,
                  pitch, plane, per, blocks))


@helper
def _grad_input_block(task, dx, grad, w, sh, sw, ph, pw, dh, dw, n, h, width, cg, kh, kw, ho, wo, per_group,
                      pitch, plane, per, blocks):
    """The (input channel, block of images) ``task`` of ``grad_input_``."""
    ch, blk = task // blocks, task % blocks
    i0, i1 = blk * per, min(n, (blk + 1) * per)
    g, cj = ch // cg, ch % cg
    acc = np.zeros((i1 - i0) * plane, dtype=dx.dtype)
    src = np.empty((i1 - i0) * plane, dtype=dx.dtype)
    for co in range(g * per_group, (g + 1) * per_group):
        _pad_planes(grad, i0, i1, co, 0, 0, pitch, plane, src)
        for a in range(kh):
            for b in range(kw):
                _scatter_tap(acc, src, w[co, cj, a, b], a * dh * pitch + b * dw, i1 - i0,
                             sh, sw, pitch, plane, ho, wo)
    for i in range(i0, i1):
        for r in range(h):
            start = (i - i0) * plane + (ph + r) * pitch + pw
            row, part = dx[i, ch, r], acc[start:start + width]
            for j in range(width):
                row[j] = part[j]


@kernel
def grad_input_(dx, grad, w, sh, sw, ph, pw, dh, dw):
    """dx [N, C, H, W] of conv(x, w) from grad [N, Cout, Ho, Wo], one task per (input
    channel, block of images): each output channel of the group is laid out as a
    block, then every tap adds it, weighted, into the padded input positions it read;
    the padding is dropped on the way out.  dx is an argument so that it counts in
    the kernel's size (``SizedKernel``): it is C/Cout times the gradient's."""
    n, c, h, width = dx.shape
    cout, cg, kh, kw = w.shape
    ho, wo = grad.shape[2], grad.shape[3]
    per_group = cout // (c // cg)
    pitch = width + 2 * pw
    plane = (h + 2 * ph) * pitch
    per, blocks = _blocks(n, plane)
    parallel_for(_grad_input_block, c * blocks,
                 (dx, grad, w, sh, sw, ph, pw, dh, dw, n, h, width, cg, kh, kw, ho, wo, per_group,
                  pitch, plane, per, blocks))


@helper
def _grad_weight_pair(task, out, grad, x, kh, kw, sh, sw, ph, pw, dh, dw, n, cg, ho, wo, per_group,
                      pitch, plane, per, blocks):
    """The (output channel, input channel of its group) ``task`` of ``grad_weight``."""
    co, cj = task // cg, task % cg
    ch = co // per_group * cg + cj
    sums = out[co, cj]
    src = np.empty(per * plane, dtype=x.dtype)
    gsrc = np.empty(per * plane, dtype=x.dtype)
    for blk in range(blocks):
        i0, i1 = blk * per, min(n, (blk + 1) * per)
        _pad_planes(x, i0, i1, ch, ph, pw, pitch, plane, src)
        _pad_planes(grad, i0, i1, co, 0, 0, pitch, plane, gsrc)
        for a in range(kh):
            for b in range(kw):
                sums[a, b] += _tap_dot(gsrc, src, a * dh * pitch + b * dw, i1 - i0,
                                       sh, sw, pitch, plane, ho, wo)


@kernel
def grad_weight(grad, x, groups, kh, kw, sh, sw, ph, pw, dh, dw):
    """dw [Cout, C/groups, kh, kw] of conv(x, w) from grad [N, Cout, Ho, Wo], one task
    per (output channel, input channel of its group): block by block, it lays out
    both channels' planes, then takes one dot product per tap."""
    n, c, h, width = x.shape
    cout, ho, wo = grad.shape[1], grad.shape[2], grad.shape[3]
    cg, per_group = c // groups, cout // groups
    pitch = width + 2 * pw
    plane = (h + 2 * ph) * pitch
    per, blocks = _blocks(n, plane)
    out = np.zeros((cout, cg, kh, kw), dtype=x.dtype)
    parallel_for(_grad_weight_pair, cout * cg,
                 (out, grad, x, kh, kw, sh, sw, ph, pw, dh, dw, n, cg, ho, wo, per_group,
                  pitch, plane, per, blocks))
    return out
