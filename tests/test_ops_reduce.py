"""Reductions over any axes (with keepdims), arg-reductions and matmul."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tensorcore as tc
from op_harness import axes, broadcast_shapes, check_op, load_torch, shapes

torch = load_torch()


def _torch_dim(axis):
    """torch spells 'all axes' as a missing dim, not None, for some reductions."""
    return {} if axis is None else {"dim": axis}


def _torch_reduce(name, axis, keepdims):
    """torch's reduction ``name`` over axis (None, int or tuple), one axis at a time."""
    def run(x):
        dims = range(x.ndim) if axis is None else [axis] if isinstance(axis, int) else axis
        for d in sorted((d % x.ndim for d in dims), reverse=True):
            x = getattr(torch, name)(x, dim=d, keepdim=keepdims)
        return x
    return run


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "logsumexp"])
@given(data=st.data(), keepdims=st.booleans())
def test_smooth_reductions(backend, data, name, keepdims):
    # mean and logsumexp of an empty selection are NaN / an error: keep dims non-empty there
    shape = data.draw(shapes(min_side=0 if name in ("sum", "prod") else 1))
    axis = data.draw(axes(len(shape)))
    refs = {"sum": np.sum, "mean": np.mean, "prod": np.prod,
            "logsumexp": lambda x, axis, keepdims: np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))}
    check_op(backend, data, lambda x: getattr(x, name)(axis, keepdims),
             lambda x: refs[name](x, axis=axis, keepdims=keepdims), [shape],
             torch_op=_torch_reduce(name, axis, keepdims))


@pytest.mark.parametrize("name", ["var", "std"])
@given(data=st.data(), keepdims=st.booleans(), correction=st.sampled_from([0, 1]))
def test_var_std(backend, data, name, keepdims, correction):
    shape = data.draw(shapes(min_dims=1, min_side=2))
    axis = data.draw(axes(len(shape)))
    check_op(backend, data, lambda x: getattr(x, name)(axis, keepdims, correction),
             lambda x: getattr(np, name)(x, axis=axis, keepdims=keepdims, ddof=correction), [shape],
             torch_op=lambda x: getattr(torch, name)(x, dim=axis, keepdim=keepdims, correction=correction),
             grad_tol=1e-4)


@pytest.mark.parametrize("name", ["max", "min"])
@given(data=st.data(), keepdims=st.booleans())
def test_max_min(backend, data, name, keepdims):
    shape = data.draw(shapes(min_side=1))
    axis = data.draw(axes(len(shape)))
    check_op(backend, data, lambda x: getattr(x, name)(axis, keepdims),
             lambda x: getattr(np, name)(x, axis=axis, keepdims=keepdims), [shape],
             torch_op=_torch_reduce("amax" if name == "max" else "amin", axis, keepdims))


def test_max_shares_gradient_among_ties(backend):
    x = tc.tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], requires_grad=True)
    x.max(axis=1).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 0.5, 0.5], [0.5, 0, 0.5]])


def test_prod_gradient_with_zeros(backend):
    x = tc.tensor([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 4.0]], requires_grad=True)
    x.prod(axis=1).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 6, 0], [0, 0, 0], [8, 4, 2]])


def test_logsumexp_is_stable(backend):
    x = tc.tensor([[1000.0, 1000.0], [-1000.0, -1000.0]])
    np.testing.assert_allclose(x.logsumexp(axis=1).numpy(), [1000 + np.log(2), -1000 + np.log(2)], rtol=1e-6)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@given(data=st.data(), keepdims=st.booleans())
def test_arg_reductions(backend, data, name, keepdims):
    shape = data.draw(shapes(min_dims=1, min_side=1))
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))

    def torch_op(x):
        return getattr(torch, name)(x, **_torch_dim(axis), keepdim=keepdims)
    check_op(backend, data, lambda x: getattr(x, name)(axis, keepdims),
             lambda x: getattr(np, name)(x, axis=axis, keepdims=keepdims), [shape],
             torch_op=torch_op if axis is not None or not keepdims else None)


@st.composite
def matmul_shapes(draw):
    """Operands of ``@``: 1-D vectors, matrices and broadcasting stacks of matrices."""
    m, k, n = draw(st.integers(0, 4)), draw(st.integers(0, 4)), draw(st.integers(0, 4))
    batch_a, batch_b = draw(broadcast_shapes(2, max_dims=2, max_side=3))
    a = (k,) if draw(st.booleans()) else batch_a + (m, k)
    b = (k,) if draw(st.booleans()) else batch_b + (k, n)
    return a, b


@given(data=st.data())
def test_matmul(backend, data):
    a, b = data.draw(matmul_shapes())
    fn = lambda x, y: x @ y  # noqa: E731
    check_op(backend, data, fn, fn, [a, b], torch_op=fn)


@given(data=st.data())
def test_matmul_function_and_transposed_operand(backend, data):
    a, b = data.draw(matmul_shapes())
    b_t = b if len(b) == 1 else b[:-2] + (b[-1], b[-2])
    check_op(backend, data, lambda x, y: tc.matmul(x, y if y.ndim == 1 else y.transpose(-1, -2)),
             lambda x, y: x @ (y if y.ndim == 1 else np.swapaxes(y, -1, -2)), [a, b_t],
             torch_op=lambda x, y: x @ (y if y.ndim == 1 else y.transpose(-1, -2)))
