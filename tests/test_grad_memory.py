"""Leaf gradients own their memory, yet fresh results are kept without a copy: a
reshape of a buffer another leaf (or the caller) holds is copied, and a weight used
through ``.T`` gets a row-major gradient in its own layout."""

from __future__ import annotations

import numpy as np

import tensorcore as tc


def _leaf(values):
    return tc.tensor(np.asarray(values, dtype=np.float64), requires_grad=True)


def test_a_reshaped_view_of_another_leafs_gradient_is_copied(backend):
    a, b = _leaf([[1.0, 2.0], [3.0, 4.0]]), _leaf([5.0, 6.0, 7.0, 8.0])
    (a.reshape(4) + b).sum().backward()  # both leaves receive the same buffer
    with tc.no_grad():
        b.grad.add_(10.0)
    np.testing.assert_array_equal(a.grad.numpy(), np.ones((2, 2)))
    np.testing.assert_array_equal(b.grad.numpy(), np.full(4, 11.0))


def test_a_reshaped_view_of_the_callers_gradient_is_copied(backend):
    a = _leaf([[1.0, 2.0], [3.0, 4.0]])
    seed = tc.tensor(np.arange(4.0))
    a.reshape(4).backward(seed)
    with tc.no_grad():
        seed.fill_(-1.0)
    np.testing.assert_array_equal(a.grad.numpy(), np.arange(4.0).reshape(2, 2))


def test_a_transposed_weight_gets_a_row_major_gradient(backend):
    rng = np.random.default_rng(0)
    x_np, w_np = rng.standard_normal((5, 3)), rng.standard_normal((4, 3))
    x, w = _leaf(x_np), _leaf(w_np)
    (x @ w.T).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.ones((5, 4)).T @ x_np, rtol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), np.ones((5, 4)) @ w_np, rtol=1e-12)
    assert w.grad.data.flags.c_contiguous
