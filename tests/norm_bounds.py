"""Error bounds for normalisation gradients computed in float32 (LayerNorm, GroupNorm).

A statistic covers a set of M values: a row of LayerNorm, a group of GroupNorm.  With
xhat = (x - mean) * rstd, H = g * act'(xhat * w + b) the gradient reaching the affine
output and G = H * w the gradient reaching xhat,

    dx = rstd * (G - mean(G) - xhat * mean(G * xhat)),
    dw = sum of H * xhat,   db = sum of H   (over everything but the channel).

A float32 kernel works from the forward's float32 mean and rstd and rounds every product
and sum.  The mean's rounding error, about u * max|x|, shifts every xhat by rstd times
that, and rstd * max|x| = max|x| / sigma is large when a set's values lie close together
(two-element groups): so the error of dx is not small relative to dx, whose terms cancel
almost exactly there, but it is small relative to the terms.  These functions propagate
the rounding errors to first order, in magnitudes of the terms, and return twice that (the
second-order terms), elementwise, as an ``atol`` for comparing a float32 result with a
float64 reference computed from the same (float32-rounded) inputs.

Arrays are float64 and shaped [sets, M] (one row per statistic); ``curvature`` bounds
|d act'(z) / dz| (0 without an activation), u is float32's unit roundoff.
"""

from __future__ import annotations

import numpy as np

U = 2.0**-24
CURVATURE = {"none": 0.0, "silu": 0.5}  # max |act''|: silu''(0) = 1/2 is its largest value


def _depth(count: int) -> float:
    """Rounding steps in a sum of ``count`` terms taken as a tree, plus the final ops."""
    return float(np.log2(max(count, 2))) + 2.0


def xhat_error(x, mean, rstd):
    """Bound on |xhat computed in float32 - xhat| per element, and on the relative error
    of the float32 rstd (one per set): the mean is off by up to depth * u * max|x|, which
    moves xhat by rstd times that and rstd by the same relative amount."""
    depth = _depth(x.shape[-1])
    mean_err = depth * U * np.max(np.abs(x), axis=-1, keepdims=True)
    rstd_rel = rstd * mean_err + depth * U
    xhat = (x - mean) * rstd
    return rstd * mean_err + np.abs(xhat) * (rstd_rel + 2 * U), rstd_rel


def input_grad_atol(x, mean, rstd, G, dG):
    """atol for dx.  ``G`` is the gradient reaching xhat and ``dG`` bounds |dG / dxhat|
    (|g| * w^2 * curvature with an activation, else 0)."""
    E, rstd_rel = xhat_error(x, mean, rstd)
    xhat = (x - mean) * rstd
    depth = _depth(x.shape[-1])
    c2 = np.mean(G * xhat, axis=-1, keepdims=True)
    dx = rstd * (G - np.mean(G, axis=-1, keepdims=True) - xhat * c2)
    avg = (lambda a: np.mean(a, axis=-1, keepdims=True))
    from_xhat = dG * E + avg(dG * E) + E * np.abs(c2) + np.abs(xhat) * avg((dG * np.abs(xhat) + np.abs(G)) * E)
    rounding = (depth + 3) * U * (np.abs(G) + avg(np.abs(G)) + np.abs(xhat) * avg(np.abs(G * xhat)))
    return 2 * (np.abs(dx) * (rstd_rel + U) + rstd * (from_xhat + rounding))


def param_grad_atol(x, mean, rstd, H, dH, channel_sum):
    """(atol for dw, atol for db).  ``H`` is the gradient reaching the affine output,
    ``dH`` bounds |dH / dxhat|, and ``channel_sum`` sums a [sets, M] array into one value
    per channel."""
    E, _ = xhat_error(x, mean, rstd)
    xhat = (x - mean) * rstd
    count = H.size // channel_sum(H).size
    depth = _depth(count)
    dw = channel_sum((dH * np.abs(xhat) + np.abs(H)) * E) + (depth + 1) * U * channel_sum(np.abs(H * xhat))
    db = channel_sum(dH * E) + depth * U * channel_sum(np.abs(H))
    return 2 * dw, 2 * db


def _act_grad(act: str, z):
    """act'(z) for the activations CURVATURE knows."""
    if act == "none":
        return np.ones_like(z)
    s = 1.0 / (1.0 + np.exp(-z))
    return s * (1.0 + z * (1.0 - s))


def group_norm_atols(x, g, w, b, mean, rstd, groups: int, act: str = "none"):
    """(dx, dw, db) atols of a float32 GroupNorm backward on x [N, C, *] from the float64
    statistics ``mean`` / ``rstd`` [N, groups]; w, b may be None."""
    n, c = x.shape[:2]
    channel = (1, c) + (1,) * (x.ndim - 2)
    w = np.ones(c) if w is None else w
    b = np.zeros(c) if b is None else b
    sets = (lambda a: np.broadcast_to(a, x.shape).reshape(n * groups, -1))
    xs, mean, rstd = sets(x), mean.reshape(-1, 1), rstd.reshape(-1, 1)
    xhat = ((xs - mean) * rstd).reshape(x.shape)
    H = g * _act_grad(act, xhat * w.reshape(channel) + b.reshape(channel))
    dH = np.abs(g * w.reshape(channel)) * CURVATURE[act]
    wc = np.abs(w.reshape(channel))
    dx = input_grad_atol(xs, mean, rstd, sets(H * w.reshape(channel)), sets(dH * wc))
    axes = (0,) + tuple(range(2, x.ndim))
    dw, db = param_grad_atol(xs, mean, rstd, sets(H), sets(dH),
                             lambda a: a.reshape(x.shape).sum(axis=axes))
    return dx.reshape(x.shape), dw, db


def layer_norm_atols(x, g, w, mean, rstd, n_norm: int):
    """(dx, dw, db) atols of a float32 LayerNorm backward over the last ``n_norm`` axes
    from the float64 statistics ``mean`` / ``rstd`` (one per row); w may be None."""
    feats = int(np.prod(x.shape[x.ndim - n_norm:]))
    rows = (lambda a: np.broadcast_to(a, x.shape).reshape(-1, feats))
    xs, gs, mean, rstd = rows(x), rows(g), mean.reshape(-1, 1), rstd.reshape(-1, 1)
    ws = np.ones((1, feats)) if w is None else w.reshape(1, feats)
    zero = np.zeros_like(xs)
    dx = input_grad_atol(xs, mean, rstd, gs * ws, zero)
    norm_shape = x.shape[x.ndim - n_norm:]
    dw, db = param_grad_atol(xs, mean, rstd, gs, zero, lambda a: a.sum(axis=0).reshape(norm_shape))
    return dx.reshape(x.shape), dw, db
