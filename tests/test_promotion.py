"""Type promotion follows PyTorch where it and NumPy disagree (the table in
docs/semantics.md): a float32 model stays float32 when integers or Python floats meet it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tensorcore as tc
from op_harness import load_torch

torch = load_torch()
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (pip install torch==2.13.0)")

DTYPES = [tc.bool_, tc.uint8, tc.int32, tc.int64, tc.float16, tc.bfloat16, tc.float32, tc.float64]


def _t(dtype, shape=(3,)):
    return tc.ones(*shape, dtype=dtype)


# the rows of the table in docs/semantics.md: (expression, expected dtype)
TABLE = [
    ("int64[3] * 0.5", lambda: tc.arange(0, 3) * 0.5, tc.float32),
    ("int32[3] + 1.5", lambda: _t(tc.int32) + 1.5, tc.float32),
    ("bool[3] + 1.5", lambda: _t(tc.bool_) + 1.5, tc.float32),
    ("bool[3] + 1", lambda: _t(tc.bool_) + 1, tc.int64),
    ("3 * bool[3]", lambda: 3 * _t(tc.bool_), tc.int64),
    ("int32[3] + 1", lambda: _t(tc.int32) + 1, tc.int32),
    ("float16[3] * 0.5", lambda: _t(tc.float16) * 0.5, tc.float16),
    ("float32[3] + int64[3]", lambda: _t(tc.float32) + _t(tc.int64), tc.float32),
    ("float16[3] + int64[3]", lambda: _t(tc.float16) + _t(tc.int64), tc.float16),
    ("float32[3] + float64[3]", lambda: _t(tc.float32) + _t(tc.float64), tc.float64),
    ("float16[3] + bfloat16[3]", lambda: _t(tc.float16) + _t(tc.bfloat16), tc.float32),
    ("int32[3] + int64[3]", lambda: _t(tc.int32) + _t(tc.int64), tc.int64),
    ("uint8[3] + int32[3]", lambda: _t(tc.uint8) + _t(tc.int32), tc.int32),
    ("float32[3] * float64 0-d", lambda: _t(tc.float32) * tc.tensor(2.0, dtype=tc.float64), tc.float32),
    ("int32[3] + int64 0-d", lambda: _t(tc.int32) + tc.tensor(2), tc.int32),
    ("int64[3] + float64 0-d", lambda: _t(tc.int64) + tc.tensor(2.0, dtype=tc.float64), tc.float64),
    ("int64[3] / int64[3]", lambda: _t(tc.int64) / _t(tc.int64), tc.float32),
    ("int64[3] / 2", lambda: _t(tc.int64) / 2, tc.float32),
    ("int64[3] ** 0.5", lambda: _t(tc.int64) ** 0.5, tc.float32),
    ("int64[3] ** 2", lambda: _t(tc.int64) ** 2, tc.int64),
    ("exp(int64[3])", lambda: _t(tc.int64).exp(), tc.float32),
    ("mean(int64[3])", lambda: _t(tc.int64).mean(), tc.float32),
    ("where(mask, int64[3], 0.5)", lambda: tc.where(_t(tc.bool_), _t(tc.int64), 0.5), tc.float32),
    ("clip(int64[3], 0.5)", lambda: _t(tc.int64).clip(min=0.5), tc.float32),
    ("cat([int64[3], float32[3]])", lambda: tc.cat([_t(tc.int64), _t(tc.float32)]), tc.float32),
    ("maximum(int64[3], float16[3])", lambda: tc.maximum(_t(tc.int64), _t(tc.float16)), tc.float16),
]


@pytest.mark.parametrize("name", [row[0] for row in TABLE])
def test_the_promotion_table(backend, name):
    _, make, expected = next(row for row in TABLE if row[0] == name)
    assert make().dtype == expected


def test_values_are_computed_in_the_promoted_dtype(backend):
    np.testing.assert_array_equal((tc.arange(0, 4) * 0.5).numpy(), np.array([0, 0.5, 1, 1.5], np.float32))
    np.testing.assert_array_equal((tc.arange(1, 4) / tc.tensor([2, 2, 2])).numpy(), np.array([0.5, 1, 1.5], np.float32))
    big = tc.tensor([2**40 + 1])  # int64 values meet float32 as float32, as in PyTorch
    assert (big + tc.zeros(1)).item() == np.float32(2**40 + 1)


def test_gradients_flow_through_the_casts(backend):
    w = tc.ones(3, requires_grad=True)
    scale = tc.tensor(2.0, dtype=tc.float64, requires_grad=True)
    y = w * scale
    assert y.dtype == tc.float32
    (y * tc.tensor([1.0, 2.0, 3.0])).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 4.0, 6.0])
    assert scale.grad.dtype == tc.float64 and scale.grad.item() == 6.0


def _operand(kind: str, dtype):
    """An operand of one promotion tier: a tensor with dimensions, a 0-d tensor."""
    return (tc.ones(2, dtype=dtype), torch.ones(2, dtype=_torch_dtype(dtype))) if kind == "dim" else \
        (tc.ones((), dtype=dtype), torch.ones((), dtype=_torch_dtype(dtype)))


def _torch_dtype(dtype):
    return {tc.bfloat16: torch.bfloat16, tc.bool_: torch.bool}.get(dtype) or getattr(torch, str(dtype))


@needs_torch
@pytest.mark.parametrize("kinds", [("dim", "dim"), ("dim", "0-d"), ("0-d", "dim"), ("0-d", "0-d")])
def test_tensor_pairs_promote_as_torch(kinds):
    for a_dtype, b_dtype in itertools.product(DTYPES, repeat=2):
        (a, ta), (b, tb) = _operand(kinds[0], a_dtype), _operand(kinds[1], b_dtype)
        expected = torch.result_type(ta, tb)
        assert (a * b).dtype == _from_torch(expected), (kinds, a_dtype, b_dtype)
        divided = (ta.float() if not ta.is_floating_point() and not tb.is_floating_point() else ta) / tb
        assert (a / b).dtype == _from_torch(divided.dtype), (kinds, a_dtype, b_dtype, "div")


@needs_torch
@pytest.mark.parametrize("scalar", [True, 3, 2.5])
@pytest.mark.parametrize("kind", ["dim", "0-d"])
def test_tensor_and_python_scalar_promote_as_torch(kind, scalar):
    for dtype in DTYPES:
        tensor, theirs = _operand(kind, dtype)
        expected = torch.result_type(theirs, scalar)
        assert (tensor * scalar).dtype == _from_torch(expected), (kind, dtype, scalar)
        assert (scalar * tensor).dtype == _from_torch(expected), (kind, dtype, scalar, "reflected")


def _from_torch(dtype):
    return tc.bfloat16 if dtype == torch.bfloat16 else np.dtype(str(dtype).removeprefix("torch."))
