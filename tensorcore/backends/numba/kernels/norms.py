"""Layer, group and batch normalisation, forward and backward.

Statistics come from ``reductions.moments`` (blockwise Welford merge, float64
accumulation).  Weight-gradient sums are built from per-row or per-thread partial
sums, so no two threads write the same element.
"""

from __future__ import annotations

import math

import numpy as np

from .activations import act_grad_row, act_row
from .jit import helper, inlined, kernel, wide_vectors
from .lanes import DOT_DEVIATION, SUM, lane_sum
from .parallel import parallel_for
from .reductions import column_sums, column_sums_into, moments


@helper
def _row_stats(row, eps):
    """(mean, rstd) of one contiguous row, in float64."""
    m, m2 = moments(row)
    return m, 1.0 / math.sqrt(m2 / row.size + eps)


@helper
def _layer_norm_row(r, x, out, mean, rstd, weight, bias, eps):
    wide_vectors()
    row, res = x[r], out[r]
    m64, s64 = _row_stats(row, eps)
    m, s = mean.dtype.type(m64), mean.dtype.type(s64)
    mean[r], rstd[r] = m, s
    for c in range(row.size):
        res[c] = (row[c] - m) * s * weight[c] + bias[c]


@kernel
def layer_norm_rows(x, weight, bias, eps):
    """Normalise each row of x [R, D], then scale by weight [D] and shift by bias [D];
    one pass per row while it is in cache.  Returns (y, mean [R], rstd [R])."""
    rows = x.shape[0]
    out = np.empty_like(x)
    mean = np.empty(rows, dtype=x.dtype)
    rstd = np.empty(rows, dtype=x.dtype)
    parallel_for(_layer_norm_row, rows, (x, out, mean, rstd, weight, bias, eps))
    return out, mean, rstd


@helper
def _layer_norm_chunk_backward(k, grad, x, weight, mean, rstd, dx, part_w, part_b, rows, width, chunks,
                               inv_width):
    """dx of chunk ``k``'s rows, and their dweight/dbias sums into row ``k`` of the partials."""
    t = x.dtype.type
    pw, pb = part_w[k], part_b[k]
    for r in range(k * rows // chunks, (k + 1) * rows // chunks):
        g, row, res = grad[r], x[r], dx[r]
        m, s = mean[r], rstd[r]
        sum_gw = t(0.0)
        sum_gwx = t(0.0)
        for c in range(width):
            xhat = (row[c] - m) * s
            gw = g[c] * weight[c]
            sum_gw += gw
            sum_gwx += gw * xhat
            pw[c] += g[c] * xhat
            pb[c] += g[c]
        a = sum_gw * inv_width
        b = sum_gwx * inv_width
        for c in range(width):
            xhat = (row[c] - m) * s
            res[c] = s * (g[c] * weight[c] - a - xhat * b)


@kernel
def layer_norm_rows_backward(grad, x, weight, mean, rstd, chunks):
    """(dx, dweight, dbias) of ``layer_norm_rows``; rows are split into ``chunks``
    blocks that each sum their own share of dweight/dbias."""
    t = x.dtype.type
    rows, width = x.shape
    dx = np.empty_like(x)
    part_w = np.zeros((chunks, width), dtype=x.dtype)
    part_b = np.zeros((chunks, width), dtype=x.dtype)
    inv_width = t(1.0) / t(width)
    parallel_for(_layer_norm_chunk_backward, chunks,
                 (grad, x, weight, mean, rstd, dx, part_w, part_b, rows, width, chunks, inv_width))
    return dx, column_sums(part_w), column_sums(part_b)


@inlined
def _normalize_group(src, dst, i, g, m, s, weight, bias):
    """dst[i, g] = src[i, g] * scale + offset channel by channel (src, dst [N, G, Cg, S]):
    the affine normalisation of group g of sample i, scale = s * weight, offset = bias -
    m * scale."""
    cg = src.shape[2]
    for j in range(cg):
        c = g * cg + j
        scale = s * weight[c]
        offset = bias[c] - m * scale
        a, b = src[i, g, j], dst[i, g, j]
        for p in range(a.size):
            b[p] = a[p] * scale + offset


@helper
def _group_norm_group(ng, x, weight, bias, eps, code, shift, groups, cg, size, out, out_flat, src_all, flat, mean,
                      rstd):
    """Group ``ng`` (sample ng // G, group ng % G) of ``group_norm_groups``."""
    wide_vectors()
    t = x.dtype.type
    i, g = ng // groups, ng % groups
    if shift is not None:
        for j in range(cg):
            src, res, add = x[i, g, j], out[i, g, j], shift[i, g * cg + j]
            for p in range(size):
                res[p] = src[p] + add
    m64, s64 = _row_stats(flat[ng], eps)
    m, s = mean.dtype.type(m64), mean.dtype.type(s64)
    mean[i, g], rstd[i, g] = m, s
    # the same loops whether or not shift was added, so a shifted call and the add
    # followed by an unshifted call agree bit for bit
    _normalize_group(src_all, out, i, g, m, s, weight, bias)
    # one activation loop over the group's channels, contiguous: per plane, a short
    # plane (16 values at 4x4) would spend more on the vector loop's edges than inside
    act_row(code, out_flat[ng], t(1.0), t(0.0), None)


@kernel
def group_norm_groups(x, weight, bias, eps, code, shift, out, mean, rstd):
    """act(group_norm) for x [N, G, Cg, S] with weight/bias [G*Cg], written into
    out [N, G, Cg, S] (C-contiguous, not overlapping x), mean [N, G] and rstd [N, G].
    ``shift`` [N, G*Cg] (or None) is added to x first: each group's sum goes into its
    rows of out, the statistics and the normalisation read it from there."""
    n, groups, cg, size = x.shape
    src_all = x if shift is None else out
    flat = src_all.reshape(n * groups, cg * size)
    out_flat = out.reshape(n * groups, cg * size)
    parallel_for(_group_norm_group, n * groups,
                 (x, weight, bias, eps, code, shift, groups, cg, size, out, out_flat, src_all, flat, mean, rstd))


@helper
def _group_norm_group_backward(ng, grad, x, weight, bias, mean, rstd, code, groups, cg, size, dx, part_w, part_b,
                               inv_count, grad_flat, dx_flat):
    """dx of group ``ng`` of ``group_norm_groups_backward``, and its channels' dweight/dbias
    sums into row ng // G of the partials."""
    wide_vectors()
    t = x.dtype.type
    i, g = ng // groups, ng % groups
    m, s = mean[i, g], rstd[i, g]
    # d pre-activation into dx, finished below: the pre-activation per channel, then one
    # derivative loop over the group's contiguous channels (as in the forward)
    _normalize_group(x, dx, i, g, m, s, weight, bias)
    act_grad_row(code, dx_flat[ng], t(1.0), t(0.0), grad_flat[ng], None)
    sum_gw = t(0.0)
    sum_gwx = t(0.0)
    for j in range(cg):
        c = g * cg + j
        src, res = x[i, g, j], dx[i, g, j]
        acc_w = lane_sum(DOT_DEVIATION, res, src, m) * s
        acc_b = lane_sum(SUM, res, res, t(0.0))
        part_w[i, c] = acc_w
        part_b[i, c] = acc_b
        sum_gw += acc_b * weight[c]
        sum_gwx += acc_w * weight[c]
    a = sum_gw * inv_count
    b = sum_gwx * inv_count
    for j in range(cg):
        c = g * cg + j
        src, res = x[i, g, j], dx[i, g, j]
        for p in range(size):
            xhat = (src[p] - m) * s
            res[p] = s * (res[p] * weight[c] - a - xhat * b)


@kernel
def group_norm_groups_backward(grad, x, weight, bias, mean, rstd, code, dx, dweight, dbias):
    """dx [N, G, Cg, S] (C-contiguous, not overlapping the inputs), dweight [G*Cg] and
    dbias [G*Cg] of ``group_norm_groups``, written into the given arrays; the
    activation's derivative is taken at the recomputed pre-activation."""
    t = x.dtype.type
    n, groups, cg, size = x.shape
    part_w = np.zeros((n, groups * cg), dtype=x.dtype)
    part_b = np.zeros((n, groups * cg), dtype=x.dtype)
    inv_count = t(1.0) / t(cg * size)
    flat = (n * groups, cg * size)
    parallel_for(_group_norm_group_backward, n * groups,
                 (grad, x, weight, bias, mean, rstd, code, groups, cg, size, dx, part_w, part_b, inv_count,
                  grad.reshape(flat), dx.reshape(flat)))
    column_sums_into(part_w, dweight)
    column_sums_into(part_b, dbias)


@helper
def _plane_moments(nc, x, channels, mean, m2):
    i, c = nc // channels, nc % channels
    mean[i, c], m2[i, c] = moments(x[i, c])


@kernel
def plane_moments(x):
    """(mean, sum of squared deviations) of every plane of x [N, C, S], float64."""
    n, channels, _ = x.shape
    mean = np.empty((n, channels), dtype=np.float64)
    m2 = np.empty((n, channels), dtype=np.float64)
    parallel_for(_plane_moments, n * channels, (x, channels, mean, m2))
    return mean, m2


@helper
def _plane_sums(nc, grad, x, center, channels, sum_g, sum_gx):
    t = x.dtype.type
    i, c = nc // channels, nc % channels
    g, src = grad[i, c], x[i, c]
    m = center[c]
    sum_g[i, c] = lane_sum(SUM, g, g, t(0.0))
    sum_gx[i, c] = lane_sum(DOT_DEVIATION, g, src, m)


@kernel
def plane_sums(grad, x, center):
    """Per plane of [N, C, S]: sum(grad) and sum(grad * (x - center[c]))."""
    n, channels, size = x.shape
    sum_g = np.empty((n, channels), dtype=x.dtype)
    sum_gx = np.empty((n, channels), dtype=x.dtype)
    parallel_for(_plane_sums, n * channels, (grad, x, center, channels, sum_g, sum_gx))
    return sum_g, sum_gx


@helper
def _plane_affine(nc, x, scale, shift, channels, size, out):
    i, c = nc // channels, nc % channels
    src, res = x[i, c], out[i, c]
    a, b = scale[c], shift[c]
    for p in range(size):
        res[p] = src[p] * a + b


@kernel
def plane_affine(x, scale, shift):
    """x * scale[c] + shift[c] over the planes of x [N, C, S]."""
    n, channels, size = x.shape
    out = np.empty_like(x)
    parallel_for(_plane_affine, n * channels, (x, scale, shift, channels, size, out))
    return out


@helper
def _plane_affine2(nc, g, x, g_scale, x_scale, shift, channels, size, out):
    i, c = nc // channels, nc % channels
    gp, src, res = g[i, c], x[i, c], out[i, c]
    a, b, d = g_scale[c], x_scale[c], shift[c]
    for p in range(size):
        res[p] = gp[p] * a + src[p] * b + d


@kernel
def plane_affine2(g, x, g_scale, x_scale, shift):
    """g * g_scale[c] + x * x_scale[c] + shift[c] over the planes of [N, C, S]."""
    n, channels, size = x.shape
    out = np.empty_like(x)
    parallel_for(_plane_affine2, n * channels, (g, x, g_scale, x_scale, shift, channels, size, out))
    return out
