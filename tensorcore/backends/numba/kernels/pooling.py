"""Max / average pooling and nearest / bilinear upsampling (NCHW), fwd and bwd.

Every kernel runs whole (image, channel) planes per task; backward kernels add only
into their own planes, so overlapping windows accumulate without races.
"""

from __future__ import annotations

import numpy as np

from .jit import helper, inlined, kernel
from .parallel import parallel_for

PLANE_CHUNK = 4096  # input elements per parallel task in the pooling backward


@helper
def _window_pick(best, pos, nan, v, q):
    """(best, pos, nan) after seeing v at window position q: best and pos follow the
    first maximum, nan the last NaN's position (-1 while there is none).  Positions are
    floats, so each update is a select on a single float comparison, which compiles
    to a blend: random data mispredicts a branch per pick, and an integer select, or
    one on two comparisons, compiles back to a branch."""
    pos = q if v > best else pos
    best = v if v > best else best
    nan = q if v != v else nan
    return best, pos, nan


@helper
def _span(p, k, s, pad, size, covering):
    """A range [lo, hi) along one axis.  Not ``covering``: the input positions inside
    output p's window, clipped to the ``size`` inputs.  ``covering``: the outputs (of
    ``size``) whose windows cover input position p."""
    if not covering:
        start = p * s - pad
        return max(start, 0), min(start + k, size)
    t = p + pad - k + 1
    return (0 if t <= 0 else (t + s - 1) // s), min((p + pad) // s + 1, size)


@inlined
def _max_pool_halving(src, out, arg, w, ho, wo):
    """2x2 windows at stride 2 without padding (the common CNN pooling) on one flat
    plane: four straight-line picks per window instead of two nested loops whose
    bounds are clipped per window."""
    t = src.dtype.type
    for oh in range(ho):
        for ow in range(wo):
            k = 2 * oh * w + 2 * ow
            best, pos = src[k], t(0.0)  # the first value: nothing to compare it with
            nan = t(0.0) if best != best else t(-1.0)
            best, pos, nan = _window_pick(best, pos, nan, src[k + 1], t(1.0))
            best, pos, nan = _window_pick(best, pos, nan, src[k + w], t(2.0))
            best, pos, nan = _window_pick(best, pos, nan, src[k + w + 1], t(3.0))
            q = int(nan if nan >= t(0.0) else pos)
            j = k + (q & 1) + (q >> 1) * w
            out[oh * wo + ow] = src[j]  # read back: the last NaN, or the first maximum
            arg[oh * wo + ow] = j


@helper
def _max_pool_plane(p, src, out, arg, halving, kh, kw, sh, sw, ph, pw, h, w, ho, wo):
    t = src.dtype.type
    if halving:
        _max_pool_halving(src[p], out[p], arg[p], w, ho, wo)
        return
    for oh in range(ho):
        r0, r1 = _span(oh, kh, sh, ph, h, False)
        for ow in range(wo):
            c0, c1 = _span(ow, kw, sw, pw, w, False)
            best, pos, nan, q = t(-np.inf), t(0.0), t(-1.0), t(0.0)
            for ih in range(r0, r1):
                for iw in range(c0, c1):
                    best, pos, nan = _window_pick(best, pos, nan, src[p, ih * w + iw], q)
                    q += t(1.0)
            k = int(nan if nan >= t(0.0) else pos)
            j = (r0 + k // (c1 - c0)) * w + c0 + k % (c1 - c0)
            out[p, oh * wo + ow] = src[p, j]
            arg[p, oh * wo + ow] = j


@kernel
def max_pool(x, kh, kw, sh, sw, ph, pw, ho, wo):
    """(out, argmax) with argmax the flat index into each H*W plane; the first maximum
    wins, the last NaN wins over any number, and an all -inf window reports its first
    position in the image."""
    n, c, h, w = x.shape
    planes = n * c
    src = x.reshape(planes, h * w)
    out = np.empty((planes, ho * wo), dtype=x.dtype)
    arg = np.empty((planes, ho * wo), dtype=np.int64)
    halving = kh == 2 and kw == 2 and sh == 2 and sw == 2 and ph == 0 and pw == 0
    parallel_for(_max_pool_plane, planes, (src, out, arg, halving, kh, kw, sh, sw, ph, pw, h, w, ho, wo))
    return out.reshape(n, c, ho, wo), arg.reshape(n, c, ho, wo)


@helper
def _max_pool_backward_planes(task, g, a, dx, bad, chunk, planes, plane, outs):
    """Planes [task * chunk, +chunk) of ``max_pool_backward``; bad[task] marks an argmax
    outside its plane."""
    t = g.dtype.type
    for p in range(task * chunk, min(planes, task * chunk + chunk)):
        for k in range(plane):
            dx[p, k] = t(0.0)
        for k in range(outs):
            j = a[p, k]
            if j < 0 or j >= plane:
                bad[task] = True
            else:
                dx[p, j] += g[p, k]


@kernel
def max_pool_backward(grad, arg, h, w):
    """Add every output gradient into the input position its argmax names.

    Returns (dx, ok): ok is False when some argmax lies outside its H*W plane (those
    gradients are dropped, so dx must then not be used).  Each task zeroes and fills
    its own planes, so the zeroing runs in parallel and in cache; small planes are
    taken several per task (one 8x8 plane per task costs more to schedule than to
    fill)."""
    n, c, ho, wo = grad.shape
    planes, plane, outs = n * c, h * w, ho * wo
    g, a = grad.reshape(planes, outs), arg.reshape(planes, outs)
    dx = np.empty((planes, plane), dtype=grad.dtype)
    chunk = max(1, PLANE_CHUNK // max(plane, 1))
    tasks = (planes + chunk - 1) // chunk
    bad = np.zeros(tasks, dtype=np.bool_)
    parallel_for(_max_pool_backward_planes, tasks, (g, a, dx, bad, chunk, planes, plane, outs))
    return dx.reshape(n, c, h, w), not bad.any()


@helper
def _avg_pool_plane(task, src, out, cols, inv, c, h, out_h, out_w, kh, sh, ph, backward):
    plane, dst = src[task // c, task % c], out[task // c, task % c]
    for y in range(out_h):
        r0, r1 = _span(y, kh, sh, ph, h, backward)
        for x in range(out_w):
            total = src.dtype.type(0.0)
            for a in range(r0, r1):
                for b in range(cols[x, 0], cols[x, 1]):
                    total += plane[a, b]
            dst[y, x] = total * inv


@kernel
def _avg_pool_gather(src, out_h, out_w, kh, kw, sh, sw, ph, pw, backward):
    """[N, C, out_h, out_w]: each value the sum of a rectangle of its src plane over kh *
    kw (zero padding counted in the divisor).  Forward (src the input): the output's
    window.  Backward (src the output gradient): the windows that cover the input
    position, so every input gathers its share without scattering."""
    n, c, h, w = src.shape
    out = np.empty((n, c, out_h, out_w), dtype=src.dtype)
    inv = src.dtype.type(1.0) / src.dtype.type(kh * kw)
    cols = np.empty((out_w, 2), dtype=np.int64)  # every row's column spans, computed once
    for x in range(out_w):
        cols[x, 0], cols[x, 1] = _span(x, kw, sw, pw, w, backward)
    parallel_for(_avg_pool_plane, n * c, (src, out, cols, inv, c, h, out_h, out_w, kh, sh, ph, backward))
    return out


def avg_pool(x, kh, kw, sh, sw, ph, pw, ho, wo):
    """Window means with zero padding counted in the divisor."""
    return _avg_pool_gather(x, ho, wo, kh, kw, sh, sw, ph, pw, False)


def avg_pool_backward(grad, h, w, kh, kw, sh, sw, ph, pw):
    """Each output gradient spread evenly over its window (padding included)."""
    return _avg_pool_gather(grad, h, w, kh, kw, sh, sw, ph, pw, True)


@helper
def _gather_nearest_plane(task, x, out, rows, cols, c):
    i, ch = task // c, task % c
    src, dst = x[i, ch], out[i, ch]
    for a in range(rows.size):
        line, res = src[rows[a]], dst[a]
        for b in range(cols.size):
            res[b] = line[cols[b]]


@kernel
def gather_nearest(x, rows, cols):
    """out[..., a, b] = x[..., rows[a], cols[b]]."""
    n, c = x.shape[0], x.shape[1]
    out = np.empty((n, c, rows.size, cols.size), dtype=x.dtype)
    parallel_for(_gather_nearest_plane, n * c, (x, out, rows, cols, c))
    return out


@helper
def _scatter_nearest_plane(task, grad, dx, rows, cols, c):
    i, ch = task // c, task % c
    src, dst = grad[i, ch], dx[i, ch]
    for a in range(rows.size):
        line, g = dst[rows[a]], src[a]
        for b in range(cols.size):
            line[cols[b]] += g[b]


@kernel
def scatter_nearest(grad, rows, cols, h, w):
    """Adjoint of ``gather_nearest``: sum the gradients of outputs sharing a source."""
    n, c = grad.shape[0], grad.shape[1]
    dx = np.zeros((n, c, h, w), dtype=grad.dtype)
    parallel_for(_scatter_nearest_plane, n * c, (grad, dx, rows, cols, c))
    return dx


@helper
def _bilinear_plane(task, x, out, h0, h1, hf, w0, w1, wf, c):
    t = x.dtype.type
    i, ch = task // c, task % c
    src, dst = x[i, ch], out[i, ch]
    for a in range(h0.size):
        top, bottom, fa = src[h0[a]], src[h1[a]], hf[a]
        res = dst[a]
        for b in range(w0.size):
            fb = wf[b]
            upper = (t(1.0) - fb) * top[w0[b]] + fb * top[w1[b]]
            lower = (t(1.0) - fb) * bottom[w0[b]] + fb * bottom[w1[b]]
            res[b] = (t(1.0) - fa) * upper + fa * lower


@kernel
def bilinear(x, h0, h1, hf, w0, w1, wf):
    """Bilinear resampling with per-axis taps (lo, hi) and the weight ``f`` of hi."""
    n, c = x.shape[0], x.shape[1]
    out = np.empty((n, c, h0.size, w0.size), dtype=x.dtype)
    parallel_for(_bilinear_plane, n * c, (x, out, h0, h1, hf, w0, w1, wf, c))
    return out


@helper
def _bilinear_backward_plane(task, grad, dx, h0, h1, hf, w0, w1, wf, c):
    t = grad.dtype.type
    i, ch = task // c, task % c
    src, dst = grad[i, ch], dx[i, ch]
    for a in range(h0.size):
        top, bottom, fa = dst[h0[a]], dst[h1[a]], hf[a]
        g = src[a]
        for b in range(w0.size):
            fb = wf[b]
            upper = (t(1.0) - fa) * g[b]
            lower = fa * g[b]
            top[w0[b]] += (t(1.0) - fb) * upper
            top[w1[b]] += fb * upper
            bottom[w0[b]] += (t(1.0) - fb) * lower
            bottom[w1[b]] += fb * lower


@kernel
def bilinear_backward(grad, h, w, h0, h1, hf, w0, w1, wf):
    """Adjoint of ``bilinear``: each output gradient goes to its four taps."""
    n, c = grad.shape[0], grad.shape[1]
    dx = np.zeros((n, c, h, w), dtype=grad.dtype)
    parallel_for(_bilinear_backward_plane, n * c, (grad, dx, h0, h1, hf, w0, w1, wf, c))
    return dx
