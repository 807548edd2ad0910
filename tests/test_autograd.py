"""Reverse-mode autodiff: accumulation, no_grad, detach, requires_grad_, backward(gradient=),
broadcast reduction, deep graphs, retain_grad, gradients through setitem, custom Functions."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcore as tc


def _leaf(values, dtype=tc.float64):
    return tc.tensor(values, dtype=dtype, requires_grad=True)


def test_gradients_accumulate_across_backward_calls(backend):
    x = _leaf([1.0, 2.0, 3.0])
    (x * x).sum().backward()
    (3 * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.array([1, 2, 3]) + 3)
    x.zero_grad()
    assert x.grad is None


def test_a_tensor_used_twice_gets_both_contributions(backend):
    x = _leaf([2.0])
    y = x * x + x.exp() * x
    y.backward(tc.tensor([1.0], dtype=tc.float64))
    np.testing.assert_allclose(x.grad.numpy(), [2 * 2 + np.exp(2) * (1 + 2)])


def test_leaf_gradients_never_share_memory(backend):
    a, b = _leaf([1.0, 2.0]), _leaf([3.0, 4.0])
    seed = tc.tensor([1.0, 1.0], dtype=tc.float64)
    (a + b).backward(seed)
    with tc.no_grad():
        a.grad.add_(10.0)
        seed.fill_(7.0)
    np.testing.assert_array_equal(b.grad.numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(a.grad.numpy(), [11.0, 11.0])
    a.backward(tc.tensor([1.0, 1.0], dtype=tc.float64))  # a leaf as the root
    np.testing.assert_array_equal(a.grad.numpy(), [12.0, 12.0])


def test_no_grad_records_nothing(backend):
    x = _leaf([1.0, 2.0])
    with tc.no_grad():
        y = x * 2
    assert not y.requires_grad and y.is_leaf
    assert tc.is_grad_enabled()

    @tc.no_grad()
    def doubled(t):
        return t * 2
    assert not doubled(x).requires_grad
    with tc.set_grad_enabled(False):
        assert not (x + 1).requires_grad
    assert (x + 1).requires_grad


def test_detach_cuts_the_graph_but_shares_values(backend):
    x = _leaf([1.0, 2.0])
    d = (x * 3).detach()
    assert not d.requires_grad and d.is_leaf
    (x * d).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 6.0])


def test_requires_grad_(backend):
    x = tc.tensor([1.0, 2.0])
    assert not x.requires_grad
    assert x.requires_grad_() is x and x.requires_grad
    x.requires_grad_(False)
    assert not x.requires_grad
    with pytest.raises(TypeError, match="requires_grad"):
        tc.tensor([1, 2]).requires_grad_()
    with pytest.raises(ValueError, match="requires_grad_"):
        (_leaf([1.0]) * 2).requires_grad_(False)


def test_backward_of_a_non_scalar_needs_a_gradient(backend):
    x = _leaf([[1.0, 2.0], [3.0, 4.0]])
    y = x * x
    with pytest.raises(ValueError, match="gradient must be given"):
        y.backward()
    with pytest.raises(ValueError, match="does not match"):
        y.backward(tc.ones(3, dtype=tc.float64))
    y.backward(tc.tensor([[1.0, 0.0], [2.0, 1.0]], dtype=tc.float64))
    np.testing.assert_array_equal(x.grad.numpy(), [[2.0, 0.0], [12.0, 8.0]])


def test_backward_without_a_graph_raises(backend):
    with pytest.raises(RuntimeError, match="does not require grad"):
        tc.tensor([1.0]).sum().backward()


def _sum_to(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum g over the axes that broadcasting added to an array of ``shape``."""
    g = g.sum(axis=tuple(range(g.ndim - len(shape))))
    return g.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True)


@pytest.mark.parametrize("shape_a, shape_b", [((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((), (2, 2)), ((1, 1), (5, 1))])
def test_broadcast_gradients_are_reduced_to_the_input_shape(backend, shape_a, shape_b):
    rng = np.random.default_rng(0)
    a_np, b_np = rng.normal(size=shape_a), rng.normal(size=shape_b)
    a, b = _leaf(a_np), _leaf(b_np)
    out_shape = np.broadcast_shapes(shape_a, shape_b)
    (a * b).backward(tc.ones(*out_shape, dtype=tc.float64))
    assert a.grad.shape == shape_a and b.grad.shape == shape_b
    np.testing.assert_allclose(a.grad.numpy(), _sum_to(np.broadcast_to(b_np, out_shape), shape_a))
    np.testing.assert_allclose(b.grad.numpy(), _sum_to(np.broadcast_to(a_np, out_shape), shape_b))


def test_deep_chain_has_no_recursion_limit(backend):
    x = _leaf([1.0])
    y = x
    for _ in range(10_000):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0001 ** 10_000], rtol=1e-9)
    del y  # dropping a deep graph must not overflow the stack either


def test_retain_grad_keeps_intermediate_gradients(backend):
    x = _leaf([1.0, 2.0])
    h = x * 3
    h.retain_grad()
    y = h * h
    y.retain_grad()
    y.sum().backward()
    np.testing.assert_array_equal(y.grad.numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(h.grad.numpy(), [6.0, 12.0])
    np.testing.assert_array_equal(x.grad.numpy(), [18.0, 36.0])
    no_retain = x * 2
    (no_retain * 1).sum().backward()
    assert no_retain.grad is None


def test_setitem_gradients_flow_to_both_sides(backend):
    x, v = _leaf([1.0, 2.0, 3.0, 4.0]), _leaf([10.0, 20.0])
    y = x * 2
    y[1:3] = v * v
    y.backward(tc.tensor([1.0, 2.0, 3.0, 4.0], dtype=tc.float64))
    np.testing.assert_array_equal(y.numpy(), [2.0, 100.0, 400.0, 8.0])
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 0.0, 0.0, 8.0])
    np.testing.assert_array_equal(v.grad.numpy(), [2 * 10 * 2.0, 2 * 20 * 3.0])


def test_setitem_into_a_tensor_without_grad_records_the_value(backend):
    v = _leaf([5.0])
    buffer = tc.zeros(3, dtype=tc.float64)
    buffer[:1] = v
    (buffer * tc.tensor([2.0, 1.0, 1.0], dtype=tc.float64)).sum().backward()
    np.testing.assert_array_equal(v.grad.numpy(), [2.0])


def test_in_place_writes_to_a_leaf_that_requires_grad_raise(backend):
    x = _leaf([1.0, 2.0])
    with pytest.raises(RuntimeError, match="setitem"):
        x[0] = 5.0
    with pytest.raises(RuntimeError, match="add_"):
        x.add_(1.0)
    with tc.no_grad():
        x.add_(1.0)
    np.testing.assert_array_equal(x.numpy(), [2.0, 3.0])


def test_gradient_dtype_follows_the_input(backend):
    x = tc.tensor([1.0, 2.0], dtype=tc.float32, requires_grad=True)
    (x.double() * tc.tensor([3.0, 4.0], dtype=tc.float64)).sum().backward()
    assert x.grad.dtype == tc.float32
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 4.0])


def test_integer_outputs_do_not_track_gradients(backend):
    x = _leaf([1.5, -2.0])
    assert not (x > 0).requires_grad
    assert not x.argmax().requires_grad
    assert not x.long().requires_grad


class Cube(tc.Function):
    """A user-defined op: forward and backward over backend arrays."""

    def forward(self, x):
        self.x = x
        return self.backend.binary("pow", x, 3)

    def backward(self, g):
        return (self.backend.binary("mul", g, self.backend.binary("mul", self.backend.binary("pow", self.x, 2), 3)),)


def test_custom_function(backend):
    x = _leaf([1.0, -2.0])
    y = Cube.apply(x)
    y.sum().backward()
    np.testing.assert_array_equal(y.numpy(), [1.0, -8.0])
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 12.0])


# ----- a graph is used once unless retain_graph=True (as PyTorch) -------------------------------
def test_a_second_backward_through_a_freed_graph_raises_and_adds_nothing(backend):
    w = tc.ones(3, requires_grad=True)
    y = (w * w).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        y.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 2.0, 2.0])


def test_retain_graph_keeps_the_graph_for_another_backward(backend):
    w = tc.ones(3, requires_grad=True)
    y = (w * w).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [4.0, 4.0, 4.0])
    with pytest.raises(RuntimeError, match="backward"):
        y.backward()


def test_a_graph_shared_with_a_used_one_raises_before_any_gradient_is_written(backend):
    w = _leaf([1.0, 2.0])
    h = w.exp()
    (h * 2).sum().backward()
    first = w.grad.numpy().copy()
    with pytest.raises(RuntimeError, match="Unary"):
        (h * 3).sum().backward()  # h's graph was freed by the first pass
    np.testing.assert_array_equal(w.grad.numpy(), first)


def test_backward_frees_what_forward_saved(backend):
    import gc
    import weakref

    w = _leaf([1.0, 2.0, 3.0])
    y = (w.exp() * w).sum()  # the product saves exp(w), which no name holds
    product = y._ctx.inputs[0]._ctx
    saved = weakref.ref(product.a.base if product.a.base is not None else product.a)
    y.backward()
    del product
    gc.collect()
    assert saved() is None
    np.testing.assert_allclose(w.grad.numpy(), np.exp([1.0, 2.0, 3.0]) * (1 + np.array([1.0, 2.0, 3.0])))


def test_layers_give_the_same_gradients_again_through_a_retained_graph(backend):
    import layers

    tc.manual_seed(0)
    model = layers.Sequential(layers.Conv2d(2, 4, 3, padding=1), layers.GroupNorm(2, 4), layers.SiLU(),
                              layers.Flatten(), layers.Linear(4 * 5 * 5, 6), layers.LayerNorm(6))
    attention, lstm = layers.MultiHeadAttention(6, 2, batch_first=True), layers.LSTM(6, 3, batch_first=True)
    h = model(tc.randn(3, 2, 5, 5)).reshape(1, 3, 6)
    out, _ = lstm(attention(h, need_weights=False)[0])
    loss = (out * out).mean() + out.log_softmax(-1).sum()
    params = [p for m in (model, attention, lstm) for p in m.parameters()]
    loss.backward(retain_graph=True)
    first = [p.grad.numpy().copy() for p in params]
    loss.backward()
    for p, g in zip(params, first):
        np.testing.assert_allclose(p.grad.numpy(), 2 * g, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="retain_graph"):
        loss.backward()
