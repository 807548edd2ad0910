"""Fused optimizer updates over flat 1-D buffers, one pass over memory per step.

Scalar coefficients (bias corrections, decays) are computed once per call in float64
from the 1-element ``lr`` / ``step`` arrays and cast to the parameters' dtype, the
same arithmetic as the reference in ``numpy.optim``.  ``None`` state buffers select a
specialisation in which that branch does not exist.
"""

from __future__ import annotations

import math

from numba import prange

from .jit import kernel


@kernel
def sgd(p, g, buf, lr, momentum, dampening, nesterov, weight_decay, first_step):
    t = p.dtype.type
    rate, wd, mom, keep = t(lr[0]), t(weight_decay), t(momentum), t(1.0 - dampening)
    first = first_step[0] != 0
    for i in prange(p.size):
        d = g[i] + wd * p[i]
        if buf is not None:
            b = d if first else mom * buf[i] + keep * d
            buf[i] = b
            d = d + mom * b if nesterov else b
        p[i] -= rate * d


@kernel
def adam(p, g, m, v, vmax, lr, step, beta1, beta2, eps, weight_decay, decoupled):
    t = p.dtype.type
    lr64, step64 = float(lr[0]), float(step[0])
    step_size = t(lr64 / (1.0 - beta1 ** step64))
    inv_bc2_sqrt = t(1.0 / math.sqrt(1.0 - beta2 ** step64))
    decay = t(1.0 - lr64 * weight_decay) if decoupled else t(1.0)
    l2 = t(0.0) if decoupled else t(weight_decay)
    b1, b2, c1, c2, e = t(beta1), t(beta2), t(1.0 - beta1), t(1.0 - beta2), t(eps)
    for i in prange(p.size):
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
def rmsprop(p, g, square_avg, grad_avg, buf, lr, alpha, eps, weight_decay, momentum):
    t = p.dtype.type
    rate, a, c, e, wd, mom = t(lr[0]), t(alpha), t(1.0 - alpha), t(eps), t(weight_decay), t(momentum)
    for i in prange(p.size):
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
def adagrad(p, g, state_sum, lr, step, lr_decay, weight_decay, eps):
    t = p.dtype.type
    clr = t(float(lr[0]) / (1.0 + (float(step[0]) - 1.0) * lr_decay))
    wd, e = t(weight_decay), t(eps)
    for i in prange(p.size):
        gi = g[i] + wd * p[i]
        s = state_sum[i] + gi * gi
        state_sum[i] = s
        p[i] -= clr * (gi / (math.sqrt(s) + e))


@kernel
def lamb(p, g, m, v, ranges, lr, step, beta1, beta2, eps, weight_decay):
    t = p.dtype.type
    step64 = float(step[0])
    inv_bc1 = t(1.0 / (1.0 - beta1 ** step64))
    inv_bc2 = t(1.0 / (1.0 - beta2 ** step64))
    b1, b2, c1, c2, e, wd = t(beta1), t(beta2), t(1.0 - beta1), t(1.0 - beta2), t(eps), t(weight_decay)
    for i in prange(p.size):
        m[i] = b1 * m[i] + c1 * g[i]
        v[i] = b2 * v[i] + c2 * g[i] * g[i]
    for k in range(ranges.shape[0]):
        start, stop = ranges[k, 0], ranges[k, 1]
        p_sq = 0.0
        u_sq = 0.0
        for i in prange(start, stop):
            u = (m[i] * inv_bc1) / (math.sqrt(v[i] * inv_bc2) + e) + wd * p[i]
            p_sq += float(p[i]) * float(p[i])
            u_sq += float(u) * float(u)
        trust = math.sqrt(p_sq) / math.sqrt(u_sq) if p_sq > 0.0 and u_sq > 0.0 else 1.0
        scale = t(float(lr[0]) * trust)
        for i in prange(start, stop):
            u = (m[i] * inv_bc1) / (math.sqrt(v[i] * inv_bc2) + e) + wd * p[i]
            p[i] -= scale * u


@kernel
def lars(p, g, buf, ranges, lr, momentum, weight_decay, trust_coefficient, eps):
    t = p.dtype.type
    mom, wd = t(momentum), t(weight_decay)
    for k in range(ranges.shape[0]):
        start, stop = ranges[k, 0], ranges[k, 1]
        p_sq = 0.0
        g_sq = 0.0
        for i in prange(start, stop):
            p_sq += float(p[i]) * float(p[i])
            g_sq += float(g[i]) * float(g[i])
        p_norm, g_norm = math.sqrt(p_sq), math.sqrt(g_sq)
        local = 1.0
        if p_norm > 0.0 and g_norm > 0.0:
            local = trust_coefficient * p_norm / (g_norm + weight_decay * p_norm + eps)
        scale = t(float(lr[0]) * local)
        for i in prange(start, stop):
            b = mom * buf[i] + scale * (g[i] + wd * p[i])
            buf[i] = b
            p[i] -= b


@kernel
def lion(p, g, m, lr, beta1, beta2, weight_decay):
    t = p.dtype.type
    lr64 = float(lr[0])
    rate, decay = t(lr64), t(1.0 - lr64 * weight_decay)
    b1, b2, c1, c2 = t(beta1), t(beta2), t(1.0 - beta1), t(1.0 - beta2)
    for i in prange(p.size):
        c = b1 * m[i] + c1 * g[i]
        direction = t(1.0) if c > t(0.0) else (t(-1.0) if c < t(0.0) else t(0.0))
        p[i] = p[i] * decay - rate * direction
        m[i] = b2 * m[i] + c2 * g[i]
