"""The float32 error bounds of tests/norm_bounds.py (used by the GPU GroupNorm and
LayerNorm tests) hold for float32 arithmetic, emulated here in NumPy the way the kernels
compute: statistics by two passes or by Welford's updates, rstd a few ulps off (rsqrtf),
then the backward formula with float32 sums.  And they are not vacuous: the worst error
comes within a small factor of the bound."""

from __future__ import annotations

import numpy as np
import pytest

from norm_bounds import group_norm_atols, layer_norm_atols

F32 = np.float32
EPS = 1e-5


def stats32(sets, how: str, rng):
    """float32 (mean, rstd) of each row of ``sets`` [R, M] (float32)."""
    m = sets.shape[1]
    if how == "two-pass":
        mean = sets.sum(axis=1, dtype=F32, keepdims=True) / F32(m)
        d = sets - mean
        var = (d * d).sum(axis=1, dtype=F32, keepdims=True) / F32(m)
    else:
        count = mean = m2 = np.zeros((sets.shape[0], 1), F32)
        for j in range(m):
            v = sets[:, j:j + 1]
            count = count + F32(1)
            d = v - mean
            mean = mean + d / count
            m2 = m2 + d * (v - mean)
        var = m2 / F32(m)
    exact = 1.0 / np.sqrt(var.astype(np.float64) + EPS)
    return mean, (exact * (1.0 + rng.uniform(-2, 2, exact.shape) * 2.0**-23)).astype(F32)


def silu_grad32(z):
    s = F32(1) / (F32(1) + np.exp(-z))
    return s * (F32(1) + z * (F32(1) - s))


def group_norm_backward32(x, g, w, b, groups: int, act: str, how: str, rng):
    """(dx, dw, db) as the plane kernels compute them, in float32."""
    n, c, s = x.shape
    sets = x.reshape(n * groups, -1)
    mean, rstd = stats32(sets, how, rng)
    xhat = ((sets - mean) * rstd).reshape(x.shape)
    wc, bc = w.reshape(1, c, 1), b.reshape(1, c, 1)
    dy = g if act == "none" else g * silu_grad32(xhat * wc + bc)
    gw = (dy * wc).reshape(sets.shape)
    xh = xhat.reshape(sets.shape)
    c1 = gw.sum(axis=1, dtype=F32, keepdims=True) / F32(sets.shape[1])
    c2 = (gw * xh).sum(axis=1, dtype=F32, keepdims=True) / F32(sets.shape[1])
    dx = rstd * (gw - c1 - xh * c2)
    return dx.reshape(x.shape), (dy * xhat).sum(axis=(0, 2), dtype=F32), dy.sum(axis=(0, 2), dtype=F32)


def group_norm_backward64(x, g, w, b, groups: int, act: str):
    """The exact (float64) gradients and statistics for the same inputs."""
    n, c, s = x.shape
    sets = x.reshape(n * groups, -1)
    mean, rstd = sets.mean(axis=1), 1.0 / np.sqrt(sets.var(axis=1) + EPS)
    xhat = ((sets - mean[:, None]) * rstd[:, None]).reshape(x.shape)
    z = xhat * w.reshape(1, c, 1) + b.reshape(1, c, 1)
    sig = 1.0 / (1.0 + np.exp(-z))
    h = g if act == "none" else g * sig * (1.0 + z * (1.0 - sig))
    gw = (h * w.reshape(1, c, 1)).reshape(sets.shape)
    xh = xhat.reshape(sets.shape)
    dx = rstd[:, None] * (gw - gw.mean(axis=1, keepdims=True)
                          - xh * (gw * xh).mean(axis=1, keepdims=True))
    return (dx.reshape(x.shape), (h * xhat).sum(axis=(0, 2)), h.sum(axis=(0, 2))), mean, rstd


# two-element groups (where the terms of dx cancel), groups of a few and of many values;
# values spread out, or close together around an offset (rstd * |x| large)
@pytest.mark.parametrize("shape, groups", [((3, 8, 1), 4), ((2, 6, 3), 3), ((1, 8, 40), 2)])
@pytest.mark.parametrize("act", ["none", "silu"])
@pytest.mark.parametrize("how", ["two-pass", "welford"])
@pytest.mark.parametrize("spread", [2.0, 1e-3])
def test_group_norm_bound_holds_and_is_tight(shape, groups, act, how, spread):
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(20):
        x = (rng.standard_normal(shape) * spread + 0.5).astype(F32)
        g = rng.standard_normal(shape).astype(F32)
        w, b = rng.standard_normal(shape[1]).astype(F32), rng.standard_normal(shape[1]).astype(F32)
        got = group_norm_backward32(x, g, w, b, groups, act, how, rng)
        args = [a.astype(np.float64) for a in (x, g, w, b)]
        want, mean, rstd = group_norm_backward64(*args, groups, act)
        atols = group_norm_atols(*args, mean.reshape(-1, groups), rstd.reshape(-1, groups),
                                 groups, act)
        for a, e, atol in zip(got, want, atols):
            ratio = np.abs(a.astype(np.float64) - e) / atol
            assert np.all(ratio <= 1.0), ratio.max()
            worst = max(worst, float(ratio.max()))
    assert worst > 0.01  # the bound is within two orders of magnitude of the real error


def test_layer_norm_bound_holds_on_two_element_rows():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 2)) * 2.0 + 1.0).astype(F32)
    g, w = rng.standard_normal((64, 2)).astype(F32), rng.standard_normal(2).astype(F32)
    mean, rstd = stats32(x, "welford", rng)
    xhat = (x - mean) * rstd
    gw = g * w
    dx = rstd * (gw - gw.mean(axis=1, dtype=F32, keepdims=True)
                 - xhat * (gw * xhat).mean(axis=1, dtype=F32, keepdims=True))
    X, G, W = (a.astype(np.float64) for a in (x, g, w))
    m, r = X.mean(axis=1), 1.0 / np.sqrt(X.var(axis=1) + EPS)
    xh = (X - m[:, None]) * r[:, None]
    gw64 = G * W
    want = r[:, None] * (gw64 - gw64.mean(axis=1, keepdims=True)
                         - xh * (gw64 * xh).mean(axis=1, keepdims=True))
    atol = layer_norm_atols(X, G, W, m, r, 1)[0]
    assert np.all(np.abs(dx - want) <= atol)
