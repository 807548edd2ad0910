"""Elementwise ops: arithmetic with broadcasting, comparisons, where/clip, math and activations."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import tensorcore as tc
import tensorcore.functional as F
import nn_reference as ref
from op_harness import broadcast_shapes, check_op, load_torch, shapes

torch = load_torch()
TF = torch.nn.functional if torch else None

BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
}


@pytest.mark.parametrize("name", sorted(BINARY))
@given(data=st.data())
def test_binary_arithmetic(backend, data, name):
    fn = BINARY[name]
    a, b = data.draw(broadcast_shapes())
    # divisors stay away from 0: values in [0.5, 2] with a random sign per operand
    low = 0.5 if name == "div" else -2.0
    check_op(backend, data, fn, fn, [a, b], torch_op=fn, low=low)


@given(data=st.data())
def test_pow_tensor_exponent(backend, data):
    a, b = data.draw(broadcast_shapes())
    check_op(backend, data, lambda x, y: x ** y, lambda x, y: x ** y, [a, b], torch_op=lambda x, y: x ** y,
             low=0.5, high=2.0)


@pytest.mark.parametrize("exponent", [2, 3, 0.5, -1.5])
@given(data=st.data())
def test_pow_scalar_exponent(backend, data, exponent):
    fn = lambda x: x ** exponent  # noqa: E731
    check_op(backend, data, fn, fn, [data.draw(shapes())], torch_op=fn, low=0.5, high=2.0)


@given(data=st.data())
def test_scalar_on_the_left(backend, data):
    fn = lambda x: 2.0 - 3.0 / x + 2 ** x  # noqa: E731
    check_op(backend, data, fn, fn, [data.draw(shapes())], torch_op=fn, low=0.5, high=2.0)


@pytest.mark.parametrize("name", ["maximum", "minimum"])
@given(data=st.data())
def test_maximum_minimum(backend, data, name):
    """Inputs on grids half a unit apart: no ties and no near-ties, where central
    differences straddle the kink (ties are tested below)."""
    a_shape, b_shape = data.draw(broadcast_shapes())
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="grid seed"))
    a = np.asarray(rng.integers(-4, 5, size=a_shape), dtype=np.float64)
    b = np.asarray(rng.integers(-4, 5, size=b_shape) + 0.5, dtype=np.float64)
    check_op(backend, data, getattr(tc, name), getattr(np, name), [a, b],
             torch_op=lambda x, y: getattr(torch, name)(x, y))


def test_maximum_splits_ties(backend):
    a = tc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = tc.tensor([1.0, 1.0, 4.0], requires_grad=True)
    tc.maximum(a, b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [0.5, 1.0, 0.0])
    np.testing.assert_array_equal(b.grad.numpy(), [0.5, 0.0, 1.0])


@pytest.mark.parametrize("name", ["eq", "ne", "lt", "le", "gt", "ge"])
@given(data=st.data())
def test_comparisons(backend, data, name):
    ops = {"eq": "__eq__", "ne": "__ne__", "lt": "__lt__", "le": "__le__", "gt": "__gt__", "ge": "__ge__"}
    fn = lambda x, y: getattr(x, ops[name])(y)  # noqa: E731
    a, b = data.draw(broadcast_shapes())
    check_op(backend, data, fn, fn, [a, b], torch_op=fn, low=-1, high=1, integer_values=True)


@given(data=st.data())
def test_logical_ops(backend, data):
    a, b = data.draw(broadcast_shapes())
    fn = lambda x, y: [(x > 0) & (y > 0), (x > 0) | (y > 0), ~(x > 0)]  # noqa: E731
    check_op(backend, data, fn, fn, [a, b], torch_op=fn)


@given(data=st.data())
def test_where(backend, data):
    cond_shape, a, b = data.draw(broadcast_shapes(3, max_dims=3))
    cond = data.draw(hnp.arrays(np.bool_, cond_shape))
    check_op(backend, data, tc.where, np.where, [cond, a, b], torch_op=lambda c, x, y: torch.where(c, x, y))


@given(data=st.data())
def test_where_with_scalar_branch_and_masked_fill(backend, data):
    check_op(backend, data, lambda x: [tc.where(x > 0, x, 0.5), x.masked_fill(x > 0, 0.5)],
             lambda x: [np.where(x > 0, x, 0.5), np.where(x > 0, 0.5, x)], [data.draw(shapes())],
             torch_op=lambda x: [torch.where(x > 0, x, 0.5), x.masked_fill(x > 0, 0.5)])


@given(data=st.data(), bounds=st.sampled_from([(-1.0, 1.0), (None, 0.5), (-0.5, None)]))
def test_clip(backend, data, bounds):
    lo, hi = bounds
    check_op(backend, data, lambda x: [tc.clip(x, lo, hi), x.clamp(lo, hi)], lambda x: [np.clip(x, lo, hi)] * 2,
             [data.draw(shapes())], torch_op=lambda x: [torch.clamp(x, lo, hi)] * 2)


# name: (tensorcore op, float64 reference, torch op, value range)
UNARY = {
    "neg": (lambda x: -x, np.negative, lambda x: -x, (-2, 2)),
    "abs": (tc.abs, np.abs, lambda x: torch.abs(x), (-2, 2)),
    "exp": (tc.exp, np.exp, lambda x: torch.exp(x), (-2, 2)),
    "log": (tc.log, np.log, lambda x: torch.log(x), (0.2, 3)),
    "log1p": (tc.log1p, np.log1p, lambda x: torch.log1p(x), (-0.5, 3)),
    "sqrt": (tc.sqrt, np.sqrt, lambda x: torch.sqrt(x), (0.2, 3)),
    "rsqrt": (tc.rsqrt, lambda x: 1 / np.sqrt(x), lambda x: torch.rsqrt(x), (0.2, 3)),
    "sin": (tc.sin, np.sin, lambda x: torch.sin(x), (-3, 3)),
    "cos": (tc.cos, np.cos, lambda x: torch.cos(x), (-3, 3)),
    "tanh": (tc.tanh, np.tanh, lambda x: torch.tanh(x), (-3, 3)),
    "sigmoid": (tc.sigmoid, ref.sigmoid, lambda x: torch.sigmoid(x), (-4, 4)),
    "relu": (tc.relu, lambda x: np.maximum(x, 0), lambda x: torch.relu(x), (-2, 2)),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), lambda x: np.where(x > 0, x, 0.1 * x),
                   lambda x: TF.leaky_relu(x, 0.1), (-2, 2)),
    "gelu": (F.gelu, ref.ACTIVATIONS["gelu"], lambda x: TF.gelu(x), (-3, 3)),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), ref.ACTIVATIONS["gelu_tanh"],
                  lambda x: TF.gelu(x, approximate="tanh"), (-3, 3)),
    "silu": (F.silu, lambda x: x * ref.sigmoid(x), lambda x: TF.silu(x), (-4, 4)),
    "softplus": (F.softplus, lambda x: np.log1p(np.exp(x)), lambda x: TF.softplus(x), (-4, 4)),
    "erf": (tc.ops.erf, ref.erf, lambda x: torch.erf(x), (-2.5, 2.5)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@given(data=st.data())
def test_unary(backend, data, name):
    op, ref, torch_op, (low, high) = UNARY[name]
    check_op(backend, data, op, ref, [data.draw(shapes())], torch_op=torch_op, low=low, high=high)


@given(data=st.data())
def test_sign_has_no_gradient_path(backend, data):
    check_op(backend, data, lambda x: x.sign() > 0, lambda x: np.sign(x) > 0, [data.draw(shapes())],
             torch_op=lambda x: x.sign() > 0)


@pytest.mark.parametrize("op, expected", [(tc.sigmoid, [0.0, 1.0]), (F.softplus, [0.0, 1000.0])])
def test_large_inputs_do_not_overflow(backend, op, expected):
    with np.errstate(over="raise", invalid="raise"):
        np.testing.assert_allclose(op(tc.tensor([-1000.0, 1000.0])).numpy(), expected, atol=1e-30)


# ----- gated activation (GEGLU's gate) -----------------------------------------------------------
@pytest.mark.parametrize("act", ["gelu", "silu", "sigmoid", "gelu_tanh"])
@pytest.mark.parametrize("dtype, bound", [(np.float32, 2e-6), (np.float16, 2e-3)])
@given(rows=st.integers(1, 5), half=st.sampled_from([1, 3, 8, 24]), seed=st.integers(0, 99))
def test_gated_activation_matches_float64_without_and_with_gradients(backend, act, dtype, bound, rows, half, seed):
    """One pass without gradients (the backend's kernel), the composite with them; both
    ``a * act(b)`` for ``[a | b] = x``; gradients checked against float64 formulas."""
    import torch

    values = np.random.default_rng(seed).standard_normal((rows, 2 * half)).astype(dtype)
    x = tc.tensor(values, device="cuda" if backend == "cupy" else "cpu")
    a, b = torch.tensor(values.astype(np.float64)).chunk(2, dim=-1)
    torch_act = {"gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu, "sigmoid": torch.sigmoid,
                 "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[act]
    want = (a * torch_act(b)).numpy()
    with tc.no_grad():
        got = F.gated_activation(x, act).numpy().astype(np.float64)
    assert np.abs(got - want).max() <= bound * max(1.0, np.abs(want).max())
    if dtype == np.float32:
        x.requires_grad_(True)
        F.gated_activation(x, act).sum().backward()
        ta = torch.tensor(values.astype(np.float64), requires_grad=True)
        first, second = ta.chunk(2, dim=-1)
        (first * torch_act(second)).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), ta.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_gated_activation_refuses_odd_widths_and_unknown_activations():
    x = tc.zeros(2, 5)
    with pytest.raises(ValueError, match="even size"):
        F.gated_activation(x)
    with pytest.raises(ValueError, match="act must be one of"):
        F.gated_activation(tc.zeros(2, 4), "swish")
