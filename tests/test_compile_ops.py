"""Random op graphs: a compiled function equals the eager one to the bit, forward and backward.

Hypothesis draws a program -- a list of ops, each reading two earlier results -- over
tensors of one shape [a, b, c]: elementwise chains, broadcasting, reductions, matmul,
convolution, layer/group norm, softmax, views (transpose, reshape, slices), gather and
in-place writes.  The compiled function is traced on the first inputs and replayed on
two more; every result must equal the eager function's on the same inputs, bit for
bit, since replay runs the same kernels.  The backward variant also returns the input
gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tensorcore as tc
import tensorcore.functional as F


def _reduce_axis(k: int) -> int:
    return k % 3


OPS = {
    "exp_tanh": lambda x, y, w, k: tc.exp(tc.tanh(x)),
    "sin_cos": lambda x, y, w, k: tc.sin(x) * tc.cos(y),
    "sigmoid": lambda x, y, w, k: tc.sigmoid(x),
    "relu": lambda x, y, w, k: tc.relu(x - 0.1),
    "silu_gelu": lambda x, y, w, k: F.silu(x) + F.gelu(y),
    "softplus_erf": lambda x, y, w, k: F.softplus(x) - tc.ops.erf(y),
    "sqrt_log": lambda x, y, w, k: tc.sqrt(x.abs() + 1.0) + tc.log1p(y.abs()),
    "div_pow": lambda x, y, w, k: x / (y.abs() + 1.0) + x.abs() ** 1.5,
    "scalar": lambda x, y, w, k: 2.5 - x * 0.5,
    "bcast": lambda x, y, w, k: x + y.sum(axis=_reduce_axis(k), keepdims=True),
    "max_center": lambda x, y, w, k: x - x.max(axis=_reduce_axis(k), keepdims=True),
    "mean_mul": lambda x, y, w, k: x.mean(axis=_reduce_axis(k), keepdims=True) * y,
    "logsumexp": lambda x, y, w, k: x.logsumexp(axis=_reduce_axis(k), keepdims=True) - y,
    "matmul": lambda x, y, w, k: x @ w["square"] + y,
    "conv": lambda x, y, w, k: F.conv2d(x.unsqueeze(0), w["conv"], w["conv_bias"], padding=1)[0],
    "layer_norm": lambda x, y, w, k: F.layer_norm(x, (x.shape[-1],), w["ln_weight"], w["ln_bias"]),
    "group_norm": lambda x, y, w, k: F.group_norm(x.unsqueeze(0), 1, w["gn_weight"], w["gn_bias"])[0],
    "softmax": lambda x, y, w, k: x.softmax(axis=_reduce_axis(k)),
    "transpose": lambda x, y, w, k: (x.transpose(0, 2) * 2.0 + y.transpose(0, 2)).transpose(0, 2),
    "reshape": lambda x, y, w, k: x.reshape(-1).reshape(x.shape) * y,
    "slices": lambda x, y, w, k: tc.cat([x[:, : k % x.shape[1]], y[:, k % x.shape[1]:]], axis=1),
    "flip": lambda x, y, w, k: x.flip(1) - y,
    "gather": lambda x, y, w, k: x[w["rows"]] + y,
    "setitem": lambda x, y, w, k: _setitem(x, y),
    "where_clip": lambda x, y, w, k: tc.where(x > y, x, y * 0.5).clip(-1.5, 1.5),
    "constant": lambda x, y, w, k: x * tc.tensor(np.linspace(-1, 1, x.shape[-1]).astype(np.float32)),
    "inplace": lambda x, y, w, k: _inplace(x, y),
}


def _setitem(x: tc.Tensor, y: tc.Tensor) -> tc.Tensor:
    z = x * 1.0
    z[0] = y[0] * 3.0
    return z


def _inplace(x: tc.Tensor, y: tc.Tensor) -> tc.Tensor:
    z = x + 0.0
    z += y
    return z


def _weights(shape: tuple[int, int, int], seed: int) -> dict[str, tc.Tensor]:
    a, b, c = shape
    rng = np.random.default_rng(seed)

    def t(*s: int) -> tc.Tensor:
        return tc.tensor(rng.standard_normal(s).astype(np.float32) * 0.5)

    return {"square": t(c, c), "conv": t(a, a, 3, 3), "conv_bias": t(a), "ln_weight": t(c), "ln_bias": t(c),
            "gn_weight": t(a), "gn_bias": t(a), "rows": tc.tensor(rng.integers(0, a, size=a))}


def _program(ops: list[tuple[str, int, int, int]], weights: dict[str, tc.Tensor]):
    def f(x: tc.Tensor, y: tc.Tensor):
        pool = [x, y]
        for name, i, j, k in ops:
            pool.append(OPS[name](pool[i % len(pool)], pool[j % len(pool)], weights, k))
        return pool[-1], pool[len(pool) // 2]
    return f


programs = st.lists(st.tuples(st.sampled_from(sorted(OPS)), st.integers(0, 50), st.integers(0, 50),
                              st.integers(0, 50)), min_size=1, max_size=6)
shapes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 5))


def _inputs(shape: tuple[int, ...], seed: int, grad: bool = False) -> list[tc.Tensor]:
    rng = np.random.default_rng(seed)
    return [tc.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=grad) for _ in range(2)]


def _same(a: tc.Tensor, b: tc.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.numpy(), b.numpy(), equal_nan=True)


@given(ops=programs, shape=shapes, seed=st.integers(0, 2**16))
def test_random_program_forward_matches_eager(backend, ops, shape, seed):
    f = _program(ops, _weights(shape, seed))
    compiled = tc.compile(f, cache_dir=False)
    with tc.no_grad():
        for call in range(3):
            x, y = _inputs(shape, seed + call)
            got, want = compiled(x, y), f(x, y)
            assert all(_same(g, w) for g, w in zip(got, want)), (ops, call)
    info = compiled.cache_info()
    assert info.traces == 1 and info.hits == 2 and info.eager_only == 0


@given(ops=programs, shape=shapes, seed=st.integers(0, 2**16))
def test_random_program_backward_matches_eager(backend, ops, shape, seed):
    program = _program(ops, _weights(shape, seed))

    def f(x: tc.Tensor, y: tc.Tensor):
        out, mid = program(x, y)
        (out.sum() + (mid * mid).sum()).backward()
        return out, x.grad, y.grad

    compiled = tc.compile(f, cache_dir=False)
    for call in range(3):
        got = compiled(*_inputs(shape, seed + call, grad=True))
        want = f(*_inputs(shape, seed + call, grad=True))
        for g, w in zip(got, want):
            assert (g is None) == (w is None)
            assert w is None or _same(g, w), (ops, call)
    assert compiled.cache_info().hits == 2


def test_float64_and_integer_programs(backend):
    """Promotion (int * float, float64) is part of the recorded calls."""
    def f(x, i):
        return (x * i + 1).sum(axis=0), (i * 2 + 1) * 3 - i, (x.double() * 1.5).exp()

    compiled = tc.compile(f, cache_dir=False)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = tc.tensor(rng.standard_normal((3, 4)).astype(np.float32))
        i = tc.tensor(rng.integers(-5, 5, (3, 4)))
        for g, w in zip(compiled(x, i), f(x, i)):
            assert _same(g, w)
    assert compiled.cache_info().hits == 2


def test_static_arguments_are_part_of_the_key(backend):
    def f(x, scale, axis=0):
        return (x * scale).sum(axis=axis)

    compiled = tc.compile(f, cache_dir=False)
    x = tc.randn(3, 4)
    for scale, axis in [(2.0, 0), (3.0, 0), (2.0, 1), (2.0, 0)]:
        assert _same(compiled(x, scale, axis=axis), f(x, scale, axis=axis))
    info = compiled.cache_info()
    assert info.traces == 3 and info.hits == 1
    assert _same(compiled(x, 2, axis=0), f(x, 2, axis=0))  # an int is another key than a float
    assert compiled.cache_info().traces == 4


def test_outputs_of_every_structure(backend):
    def f(x):
        return {"a": x * 2, "b": [x + 1, (x - 1, 3)], "c": None, "d": "tag"}

    compiled = tc.compile(f, cache_dir=False)
    x = tc.randn(2, 3)
    for _ in range(2):
        out, want = compiled(x), f(x)
        assert out["c"] is None and out["d"] == "tag" and out["b"][1][1] == 3
        assert _same(out["a"], want["a"]) and _same(out["b"][0], want["b"][0]) and _same(out["b"][1][0], want["b"][1][0])
    assert not out["a"].requires_grad


def test_returning_an_input_or_a_parameter_copies_it(backend):
    w = tc.randn(3)
    compiled = tc.compile(lambda x: (x, w), cache_dir=False)
    x = tc.randn(3)
    for _ in range(2):
        a, b = compiled(x)
        assert _same(a, x) and _same(b, w) and a.data is not x.data and b.data is not w.data


def test_host_data_of_any_layout_is_a_constant(backend):
    """Captured host data (here Fortran-ordered, as LAPACK returns it), read-only and
    written in place: the plan restores it on every call."""
    table = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))

    def f(x):
        scratch = tc.tensor(table)
        with tc.no_grad():
            scratch += x
        return x @ tc.tensor(table).T, scratch

    compiled = tc.compile(f, cache_dir=False)
    for _ in range(3):
        x = tc.randn(3, 4)
        for g, w in zip(compiled(x), f(x)):
            assert _same(g, w)
    assert compiled.cache_info().hits == 2


def test_a_reshape_that_copies_replays_as_one_copy_into_its_buffer(backend, monkeypatch):
    """A reshape of a transposed view copies; the replay copies the values straight into
    the planned buffer (``NumpyBackend.prepare``), never calling ``reshape`` itself."""
    calls = []
    cls = type(tc.get_backend())
    reshape = cls.reshape
    monkeypatch.setattr(cls, "reshape", lambda self, a, shape: calls.append(shape) or reshape(self, a, shape))
    compiled = tc.compile(lambda x: (x.transpose(0, 2) * 2.0).reshape(-1, 3) + 1.0, cache_dir=False)
    compiled(tc.randn(3, 4, 5))  # traces
    assert calls
    for _ in range(2):
        x = tc.randn(3, 4, 5)
        want = (x.transpose(0, 2) * 2.0).reshape(-1, 3) + 1.0
        calls.clear()
        assert _same(compiled(x), want)
        assert not calls
    assert compiled.cache_info().hits == 2
