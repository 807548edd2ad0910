"""The backend op conv2d(..., bias=, act=, residual=, residual_scale=) on every backend:
the fused epilogue equals the same steps composed from the backend's own ops, every
backend agrees with the NumPy one, and bad epilogue arguments raise before any work."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tensorcore as tc
from tensorcore.backends.base import ACTIVATIONS
from tensorcore.backends.numpy.backend import NumpyBackend

REF = NumpyBackend()
GEOMETRIES = [  # x shape, weight shape, stride, padding, dilation
    ((2, 3, 9, 7), (5, 3, 3, 3), (1, 1), (1, 1), (1, 1)),
    ((1, 4, 10, 11), (6, 4, 3, 2), (2, 1), (1, 0), (1, 2)),
    ((3, 5, 6, 6), (7, 5, 1, 1), (1, 1), (0, 0), (1, 1)),
]


def _inputs(x_shape, w_shape, out_shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    bias, residual = rng.standard_normal(w_shape[0]), rng.standard_normal(out_shape)
    return [a.astype(dtype) for a in (x, w, bias, residual)]


def _composed(be, x, w, geo, bias, act, residual, scale):
    y = be.bias_act(be.conv2d(x, w, *geo), bias, act, 1)
    y = y if residual is None else be.binary("add", y, residual)
    return be.binary("mul", y, be.full((), scale, y.dtype))


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_epilogue_equals_composed_ops(backend, act, geometry):
    be = tc.get_backend()
    xs, ws, stride, padding, dilation = geometry
    geo = (stride, padding, dilation, 1)
    out_shape = REF.conv2d(np.zeros(xs), np.zeros(ws), *geo).shape
    dtype = np.float64 if backend != "cupy" else np.float32
    x, w, bias, residual = (be.from_numpy(a) for a in _inputs(xs, ws, out_shape, dtype, 0))
    fused = be.conv2d(x, w, *geo, bias=bias, act=act, residual=residual, residual_scale=0.5)
    composed = _composed(be, x, w, geo, bias, act, residual, 0.5)
    tol = 1e-12 if dtype == np.float64 else 2e-5  # the GPU rounds once, the composed ops thrice
    np.testing.assert_allclose(be.to_numpy(fused), be.to_numpy(composed), rtol=tol, atol=tol)
    want = REF.conv2d(*(be.to_numpy(a).astype(np.float64) for a in (x, w)), *geo,
                      bias=be.to_numpy(bias).astype(np.float64), act=act,
                      residual=be.to_numpy(residual).astype(np.float64), residual_scale=0.5)
    np.testing.assert_allclose(be.to_numpy(fused), want, rtol=tol, atol=tol)


@given(kernel=st.integers(1, 3), stride=st.integers(1, 2), padding=st.integers(0, 1),
       channels=st.integers(1, 4), with_bias=st.booleans(), with_residual=st.booleans(),
       scale=st.sampled_from([1.0, 0.5, -2.0]), act=st.sampled_from(ACTIVATIONS))
def test_epilogue_terms_are_optional(backend, kernel, stride, padding, channels, with_bias,
                                     with_residual, scale, act):
    """Any subset of bias / residual / scale: act(conv + bias) + residual, times scale."""
    be = tc.get_backend()
    xs, ws = (2, channels, 5, 6), (3, channels, kernel, kernel)
    geo = ((stride, stride), (padding, padding), (1, 1), 1)
    out_shape = REF.conv2d(np.zeros(xs), np.zeros(ws), *geo).shape
    dtype = np.float64 if backend != "cupy" else np.float32
    x, w, bias, residual = (be.from_numpy(a) for a in _inputs(xs, ws, out_shape, dtype, 1))
    bias = bias if with_bias else None
    residual = residual if with_residual else None
    fused = be.conv2d(x, w, *geo, bias=bias, act=act, residual=residual, residual_scale=scale)
    y = be.bias_act(be.conv2d(x, w, *geo), bias, act, 1)
    want = be.to_numpy(y if residual is None else be.binary("add", y, residual)) * scale
    tol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(be.to_numpy(fused), want, rtol=tol, atol=tol)


def test_epilogue_in_bfloat16(backend):
    """bfloat16 operands: computed in float32, rounded once, like the composed ops."""
    be = tc.get_backend()
    xs, ws, stride, padding, dilation = GEOMETRIES[0]
    geo = (stride, padding, dilation, 1)
    out_shape = REF.conv2d(np.zeros(xs), np.zeros(ws), *geo).shape
    x, w, bias, residual = (be.from_numpy(a)
                            for a in _inputs(xs, ws, out_shape, tc.bfloat16, 2))
    fused = be.conv2d(x, w, *geo, bias=bias, act="silu", residual=residual, residual_scale=0.5)
    assert fused.dtype == tc.bfloat16
    wide = [be.to_numpy(a).astype(np.float64) for a in (x, w, bias, residual)]
    want = REF.conv2d(wide[0], wide[1], *geo, bias=wide[2], act="silu", residual=wide[3],
                      residual_scale=0.5)
    # inputs exact in float64; float32 accumulation, then one bfloat16 rounding (2^-8)
    np.testing.assert_allclose(be.to_numpy(fused).astype(np.float64), want, rtol=2 ** -7,
                               atol=1e-2)


@pytest.mark.parametrize("bad, message", [
    (dict(bias=np.zeros(4)), "bias must have shape"),
    (dict(residual=np.zeros((2, 5, 9, 8))), "residual must have the output's shape"),
    (dict(act="swish"), "unknown activation"),
])
def test_bad_epilogue_arguments_raise(backend, bad, message):
    be = tc.get_backend()
    x, w = be.from_numpy(np.ones((2, 3, 9, 7))), be.from_numpy(np.ones((5, 3, 3, 3)))
    kwargs = {key: be.from_numpy(v) if isinstance(v, np.ndarray) else v for key, v in bad.items()}
    with pytest.raises(ValueError, match=f"conv2d: .*{message}"):
        be.conv2d(x, w, (1, 1), (1, 1), (1, 1), 1, **kwargs)


def test_functional_conv2d_fuses_its_bias(backend):
    """tc.functional.conv2d with a bias: forward and all three gradients as before."""
    rng = np.random.default_rng(3)
    x = tc.tensor(rng.standard_normal((2, 3, 8, 8)), requires_grad=True,
                  device=tc.get_backend().device)
    w = tc.tensor(rng.standard_normal((4, 3, 3, 3)), requires_grad=True, device=x.device)
    b = tc.tensor(rng.standard_normal(4), requires_grad=True, device=x.device)
    y = tc.functional.conv2d(x, w, b, padding=1)
    g = rng.standard_normal(y.shape)
    (y * tc.tensor(g, device=x.device)).sum().backward()
    xn, wn, bn = (t.numpy() for t in (x, w, b))
    geo = ((1, 1), (1, 1), (1, 1), 1)
    np.testing.assert_allclose(y.numpy(), REF.conv2d(xn, wn, *geo) + bn[None, :, None, None],
                               rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(b.grad.numpy(), g.sum(axis=(0, 2, 3)), rtol=1e-9)
    np.testing.assert_allclose(x.grad.numpy(), REF.conv2d_grad_input(g, wn, xn.shape, *geo),
                               rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(w.grad.numpy(), REF.conv2d_grad_weight(g, xn, wn.shape, *geo),
                               rtol=1e-9, atol=1e-9)
