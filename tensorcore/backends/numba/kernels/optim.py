"""Fused optimizer updates over flat 1-D buffers, one pass over memory per step.

Scalar coefficients (bias corrections, decays) are computed once per call in float64
from the 1-element ``lr`` / ``step`` arrays and cast to the parameters' dtype, the
same arithmetic as the reference in ``numpy.optim``.  ``None`` state buffers select a
specialisation in which that branch does not exist.

Each parallel loop body takes its element index as an unsigned integer: Numba wraps a
signed index around (``a[-1]``) at every access, and that select keeps LLVM from
vectorising the loop.  The per-tensor norms of LAMB and LARS are summed in float64
over blocks of ``NORM_BLOCK`` elements, each block in order on one thread, then the
blocks' sums in order: the same bits whatever the thread count.
"""

from __future__ import annotations

import math

import numpy as np

from .jit import helper, kernel
from .parallel import parallel_for

NORM_BLOCK = 4096  # elements per parallel task of a LAMB / LARS norm


@helper
def _sgd_element(i, p, g, buf, rate, wd, mom, keep, first, nesterov):
    i = np.uintp(i)
    d = g[i] + wd * p[i]
    if buf is not None:
        b = d if first else mom * buf[i] + keep * d
        buf[i] = b
        d = d + mom * b if nesterov else b
    p[i] -= rate * d


@kernel
def sgd(p, g, buf, lr, momentum, dampening, nesterov, weight_decay, first_step):
    t = p.dtype.type
    rate, wd, mom, keep = t(lr[0]), t(weight_decay), t(momentum), t(1.0 - dampening)
    first = first_step[0] != 0
    parallel_for(_sgd_element, p.size, (p, g, buf, rate, wd, mom, keep, first, nesterov))


@helper
def _adam_element(i, p, g, m, v, vmax, step_size, inv_bc2_sqrt, decay, l2, b1, b2, c1, c2, e):
    i = np.uintp(i)
    gi = g[i] + l2 * p[i]
    mi = b1 * m[i] + c1 * gi
    vi = b2 * v[i] + c2 * gi * gi
    m[i] = mi
    v[i] = vi
    if vmax is not None:
        vi = max(vmax[i], vi)
        vmax[i] = vi
    p[i] = p[i] * decay - step_size * mi / (math.sqrt(vi) * inv_bc2_sqrt + e)


@kernel
def adam(p, g, m, v, vmax, lr, step, beta1, beta2, eps, weight_decay, decoupled):
    t = p.dtype.type
    lr64, step64 = float(lr[0]), float(step[0])
    step_size = t(lr64 / (1.0 - beta1 ** step64))
    inv_bc2_sqrt = t(1.0 / math.sqrt(1.0 - beta2 ** step64))
    decay = t(1.0 - lr64 * weight_decay) if decoupled else t(1.0)
    l2 = t(0.0) if decoupled else t(weight_decay)
    b1, b2, c1, c2, e = t(beta1), t(beta2), t(1.0 - beta1), t(1.0 - beta2), t(eps)
    parallel_for(_adam_element, p.size,
                 (p, g, m, v, vmax, step_size, inv_bc2_sqrt, decay, l2, b1, b2, c1, c2, e))


@helper
def _rmsprop_element(i, p, g, square_avg, grad_avg, buf, rate, a, c, e, wd, mom):
    i = np.uintp(i)
    gi = g[i] + wd * p[i]
    sq = a * square_avg[i] + c * gi * gi
    square_avg[i] = sq
    if grad_avg is not None:
        ga = a * grad_avg[i] + c * gi
        grad_avg[i] = ga
        sq = sq - ga * ga
    step = gi / (math.sqrt(sq) + e)
    if buf is not None:
        step = mom * buf[i] + step
        buf[i] = step
    p[i] -= rate * step


@kernel
def rmsprop(p, g, square_avg, grad_avg, buf, lr, alpha, eps, weight_decay, momentum):
    t = p.dtype.type
    rate, a, c, e, wd, mom = t(lr[0]), t(alpha), t(1.0 - alpha), t(eps), t(weight_decay), t(momentum)
    parallel_for(_rmsprop_element, p.size, (p, g, square_avg, grad_avg, buf, rate, a, c, e, wd, mom))


@helper
def _adagrad_element(i, p, g, state_sum, clr, wd, e):
    i = np.uintp(i)
    gi = g[i] + wd * p[i]
    s = state_sum[i] + gi * gi
    state_sum[i] = s
    p[i] -= clr * (gi / (math.sqrt(s) + e))


@kernel
def adagrad(p, g, state_sum, lr, step, lr_decay, weight_decay, eps):
    t = p.dtype.type
    clr = t(float(lr[0]) / (1.0 + (float(step[0]) - 1.0) * lr_decay))
    wd, e = t(weight_decay), t(eps)
    parallel_for(_adagrad_element, p.size, (p, g, state_sum, clr, wd, e))


@helper
def _norm_blocks(start, stop):
    """The number of ``NORM_BLOCK`` blocks in [start, stop)."""
    return (stop - start + NORM_BLOCK - 1) // NORM_BLOCK


@helper
def _norm_block(k, start, stop):
    """Block k of [start, stop), as unsigned (lo, hi)."""
    return np.uintp(start + k * NORM_BLOCK), np.uintp(min(stop, start + (k + 1) * NORM_BLOCK))


@helper
def _block_sums(sums, blocks):
    """The float64 sums of columns 0 and 1 of ``sums[:blocks]``, in order."""
    first = 0.0
    second = 0.0
    for k in range(blocks):
        first += sums[k, 0]
        second += sums[k, 1]
    return first, second


@helper
def _lamb_moments(i, g, m, v, b1, b2, c1, c2):
    i = np.uintp(i)
    m[i] = b1 * m[i] + c1 * g[i]
    v[i] = b2 * v[i] + c2 * g[i] * g[i]


@helper
def _lamb_norm_block(k, start, stop, p, m, v, inv_bc1, inv_bc2, e, wd, sums):
    """sums[k] = the float64 sums of p² and u² over block k of [start, stop)."""
    p_sq = 0.0
    u_sq = 0.0
    lo, hi = _norm_block(k, start, stop)
    for i in range(lo, hi):
        u = (m[i] * inv_bc1) / (math.sqrt(v[i] * inv_bc2) + e) + wd * p[i]
        p_sq += float(p[i]) * float(p[i])
        u_sq += float(u) * float(u)
    sums[k, 0] = p_sq
    sums[k, 1] = u_sq


@helper
def _lamb_step(j, start, p, m, v, inv_bc1, inv_bc2, e, wd, scale):
    i = np.uintp(start + j)
    u = (m[i] * inv_bc1) / (math.sqrt(v[i] * inv_bc2) + e) + wd * p[i]
    p[i] -= scale * u


@kernel
def lamb(p, g, m, v, ranges, lr, step, beta1, beta2, eps, weight_decay):
    t = p.dtype.type
    step64 = float(step[0])
    inv_bc1 = t(1.0 / (1.0 - beta1 ** step64))
    inv_bc2 = t(1.0 / (1.0 - beta2 ** step64))
    b1, b2, c1, c2, e, wd = t(beta1), t(beta2), t(1.0 - beta1), t(1.0 - beta2), t(eps), t(weight_decay)
    parallel_for(_lamb_moments, p.size, (g, m, v, b1, b2, c1, c2))
    sums = np.empty((_norm_blocks(0, p.size), 2))
    for k in range(ranges.shape[0]):
        start, stop = ranges[k, 0], ranges[k, 1]
        blocks = _norm_blocks(start, stop)
        parallel_for(_lamb_norm_block, blocks, (start, stop, p, m, v, inv_bc1, inv_bc2, e, wd, sums))
        p_sq, u_sq = _block_sums(sums, blocks)
        trust = math.sqrt(p_sq) / math.sqrt(u_sq) if p_sq > 0.0 and u_sq > 0.0 else 1.0
        scale = t(float(lr[0]) * trust)
        parallel_for(_lamb_step, stop - start, (start, p, m, v, inv_bc1, inv_bc2, e, wd, scale))


@helper
def _lars_norm_block(k, start, stop, p, g, sums):
    """sums[k] = the float64 sums of p² and g² over block k of [start, stop)."""
    p_sq = 0.0
    g_sq = 0.0
    lo, hi = _norm_block(k, start, stop)
    for i in range(lo, hi):
        p_sq += float(p[i]) * float(p[i])
        g_sq += float(g[i]) * float(g[i])
    sums[k, 0] = p_sq
    sums[k, 1] = g_sq


@helper
def _lars_step(j, start, p, g, buf, mom, scale, wd):
    i = np.uintp(start + j)
    b = mom * buf[i] + scale * (g[i] + wd * p[i])
    buf[i] = b
    p[i] -= b


@kernel
def lars(p, g, buf, ranges, lr, momentum, weight_decay, trust_coefficient, eps):
    t = p.dtype.type
    mom, wd = t(momentum), t(weight_decay)
    sums = np.empty((_norm_blocks(0, p.size), 2))
    for k in range(ranges.shape[0]):
        start, stop = ranges[k, 0], ranges[k, 1]
        blocks = _norm_blocks(start, stop)
        parallel_for(_lars_norm_block, blocks, (start, stop, p, g, sums))
        p_sq, g_sq = _block_sums(sums, blocks)
        p_norm, g_norm = math.sqrt(p_sq), math.sqrt(g_sq)
        local = 1.0
        if p_norm > 0.0 and g_norm > 0.0:
            local = trust_coefficient * p_norm / (g_norm + weight_decay * p_norm + eps)
        scale = t(float(lr[0]) * local)
        parallel_for(_lars_step, stop - start, (start, p, g, buf, mom, scale, wd))


@helper
def _lion_element(i, p, g, m, rate, decay, b1, b2, c1, c2):
    i = np.uintp(i)
    t = p.dtype.type
    c = b1 * m[i] + c1 * g[i]
    direction = t(1.0) if c > t(0.0) else (t(-1.0) if c < t(0.0) else t(0.0))
    p[i] = p[i] * decay - rate * direction
    m[i] = b2 * m[i] + c2 * g[i]


@kernel
def lion(p, g, m, lr, beta1, beta2, weight_decay):
    t = p.dtype.type
    lr64 = float(lr[0])
    rate, decay = t(lr64), t(1.0 - lr64 * weight_decay)
    b1, b2, c1, c2 = t(beta1), t(beta2), t(1.0 - beta1), t(1.0 - beta2)
    parallel_for(_lion_element, p.size, (p, g, m, rate, decay, b1, b2, c1, c2))
