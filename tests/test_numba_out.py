"""Numba kernels writing into arrays the caller gives (``out=``, ``numba/results.py``).

Group norm (forward and backward), attention (forward and backward), the convolution
and its gradients, in float64 against the NumPy reference, with ``out``
given and not: the results given ``out`` are the given arrays and equal the results
without it bit for bit, whatever the given arrays' strides; a wrong shape or dtype
raises before anything is written.  A compiled train step hands these calls its
planned buffers as ``out`` and still equals the eager step bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

pytest.importorskip("numba")

import tensorcore as tc  # noqa: E402
import tensorcore.functional as F  # noqa: E402
from tensorcore.backends.numba import spatial  # noqa: E402
from tensorcore.backends.numba.backend import NumbaBackend  # noqa: E402
from tensorcore.backends.numpy.backend import NumpyBackend  # noqa: E402

NB, NP = NumbaBackend(), NumpyBackend()
CLOSE = dict(rtol=1e-11, atol=1e-11)
LAYOUTS = ["contiguous", "strided", "partial"]


def rand(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def given_out(results: tuple, layout: str) -> tuple:
    """NaN-filled arrays of the results' shapes: C-contiguous, strided views, or the
    first item only (the others None, the tuple cut short)."""
    def one(r):
        if layout == "strided":
            return np.full(r.shape + (2,), np.nan, r.dtype)[..., 0]
        return np.full(r.shape, np.nan, r.dtype)
    if layout == "partial":
        return (one(results[0]),)
    return tuple(None if r is None else one(r) for r in results)


def assert_written(got: tuple, out: tuple, want: tuple) -> None:
    """``got`` (a call given ``out``) holds ``want`` (the call without it) bit for bit,
    in the given arrays where one was given."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None:
            assert g is None
            continue
        if i < len(out) and out[i] is not None:
            assert g is out[i]
        assert g.shape == w.shape and g.dtype == w.dtype and np.array_equal(g, w), i


def assert_reference(got: tuple, ref: tuple) -> None:
    for g, r in zip(got, ref):
        assert (g is None) == (r is None)
        if r is not None:
            np.testing.assert_allclose(g, r, **CLOSE)


@given(n=st.integers(1, 3), groups=st.integers(1, 3), per_group=st.integers(1, 3),
       spatial_dims=st.lists(st.integers(1, 6), max_size=2), act=st.sampled_from(["none", "silu", "gelu"]),
       affine=st.booleans(), shifted=st.booleans(), layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**16))
def test_group_norm_writes_into_out(n, groups, per_group, spatial_dims, act, affine, shifted, layout, seed):
    rng = np.random.default_rng(seed)
    c = groups * per_group
    shape = (n, c, *spatial_dims)
    x = rand(rng, shape) * 2 + 1
    w, b = (rand(rng, (c,)), rand(rng, (c,))) if affine else (None, None)
    shift = rand(rng, (n, c)) if shifted and spatial_dims else None
    want = NB.group_norm(x, w, b, groups, 1e-5, act, shift)
    assert_reference(want, NP.group_norm(x, w, b, groups, 1e-5, act, shift))
    out = given_out(want, layout)
    assert_written(NB.group_norm(x, w, b, groups, 1e-5, act, shift, out=out), out, want)

    grad = rand(rng, shape)
    _, mean, rstd = want
    want_bwd = NB.group_norm_backward(grad, x, w, b, mean, rstd, groups, act)
    assert_reference(want_bwd, NP.group_norm_backward(grad, x, w, b, mean, rstd, groups, act))
    out = given_out(want_bwd, layout)
    assert_written(NB.group_norm_backward(grad, x, w, b, mean, rstd, groups, act, out=out), out, want_bwd)


def test_group_norm_out_of_another_dtype_goes_through_the_reference():
    """float16 has no kernel: the reference computes, the results are copied into out."""
    rng = np.random.default_rng(0)
    x = rand(rng, (2, 4, 3), np.float16)
    want = NB.group_norm(x, None, None, 2, 1e-5)
    out = given_out(want, "contiguous")
    assert_written(NB.group_norm(x, None, None, 2, 1e-5, out=out), out, want)


def test_norm_out_of_the_wrong_shape_or_dtype_raises_before_writing():
    rng = np.random.default_rng(0)
    x, w, b = rand(rng, (2, 4, 3)), rand(rng, (4,)), rand(rng, (4,))
    for bad in ((np.zeros((2, 4, 4)),), (np.zeros((2, 4, 3)), np.zeros((2, 3))),
                (np.zeros((2, 4, 3), np.float32),), (None, None, None, None)):
        kept = [None if a is None else a.copy() for a in bad]
        with pytest.raises(ValueError, match="group_norm: out"):
            NB.group_norm(x, w, b, 2, 1e-5, out=bad)
        for a, k in zip(bad, kept):
            assert a is None or np.array_equal(a, k)


def heads(rng, b, h, length, d):
    """[B, H, L, D] seen in [B, L, H, D] memory, as the attention layer passes heads."""
    return rand(rng, (b, length, h, d)).transpose(0, 2, 1, 3)


@given(b=st.integers(1, 3), h=st.integers(1, 3), lq=st.integers(1, 12), lk=st.integers(1, 12),
       d=st.integers(1, 9), dv=st.integers(1, 9), masked=st.booleans(), layout=st.sampled_from(LAYOUTS),
       heads_last=st.booleans(), seed=st.integers(0, 2**16))
def test_attention_writes_into_out(b, h, lq, lk, d, dv, masked, layout, heads_last, seed):
    rng = np.random.default_rng(seed)
    q, k, v = heads(rng, b, h, lq, d), heads(rng, b, h, lk, d), heads(rng, b, h, lk, dv)
    mask = rand(rng, (1, h, lq, lk)) if masked else None
    want = NB.attention(q, k, v, mask, False, 0.4)
    assert_reference(want, NP.attention(q, k, v, mask, False, 0.4))
    out = given_out(want, layout)
    if heads_last and layout != "strided":  # the output as the plan places it: [B, L, H, D] memory
        out = (np.full((b, lq, h, dv), np.nan).transpose(0, 2, 1, 3),) + out[1:]
    assert_written(NB.attention(q, k, v, mask, False, 0.4, out=out), out, want)

    grad = rand(rng, want[0].shape)
    want_bwd = NB.attention_backward(grad, q, k, v, want[1], 0.4)
    assert_reference(want_bwd, NP.attention_backward(grad, q, k, v, want[1], 0.4))
    out = given_out(want_bwd, layout)
    assert_written(NB.attention_backward(grad, q, k, v, want[1], 0.4, out=out), out, want_bwd)


# (x shape, weight shape, stride, padding, the algorithm conv2d_grad_input takes)
GRAD_INPUT_CASES = [
    ((16, 16, 8, 8), (16, 16, 3, 3), 1, 1, spatial.WINOGRAD_BATCH),
    ((16, 64, 29, 31), (64, 64, 3, 3), 1, 1, spatial.WINOGRAD),
    ((16, 16, 8, 8), (16, 16, 3, 3), 2, 1, spatial.SUBSAMPLED),
    ((3, 6, 5, 4), (8, 6, 1, 1), 1, 0, spatial.POINTWISE),
    ((3, 6, 5, 4), (1, 6, 3, 3), 1, 1, spatial.FEW_OUT),
    ((2, 5, 6, 6), (7, 5, 3, 3), 1, 1, spatial.IM2COL),  # same-size small plane: channel-major col2im
    ((2, 5, 9, 7), (7, 5, 3, 3), 2, 2, spatial.IM2COL),
]


@pytest.mark.parametrize("xs, ws, stride, padding, algorithm", GRAD_INPUT_CASES)
def test_conv2d_grad_input_writes_into_out(xs, ws, stride, padding, algorithm):
    rng = np.random.default_rng(1)
    geo = ((stride, stride), (padding, padding), (1, 1), 1)
    x, w = rand(rng, xs), rand(rng, ws) * 0.3
    grad = rand(rng, NP.conv2d(x, w, *geo).shape)
    assert spatial.conv_algorithm("grad_input", ws, *geo, xs[0], xs[2:]) == algorithm
    want = NB.conv2d_grad_input(grad, w, xs, *geo)
    np.testing.assert_allclose(want, NP.conv2d_grad_input(grad, w, xs, *geo), rtol=1e-9, atol=1e-9)
    out = np.full(xs, np.nan)
    assert_written((NB.conv2d_grad_input(grad, w, xs, *geo, out=out),), (out,), (want,))


FORWARD_CASES = [
    ((16, 16, 8, 8), (16, 16, 3, 3), 1, 1, spatial.WINOGRAD_BATCH),
    ((16, 64, 29, 31), (64, 64, 3, 3), 1, 1, spatial.WINOGRAD),
    ((16, 16, 8, 8), (16, 16, 3, 3), 2, 1, spatial.SUBSAMPLED),
    ((3, 20, 5, 4), (8, 20, 1, 1), 1, 0, spatial.POINTWISE),
    ((3, 6, 5, 4), (1, 6, 3, 3), 1, 1, spatial.FEW_OUT),
    ((2, 1, 6, 6), (7, 1, 3, 3), 1, 1, spatial.DIRECT),
    ((2, 5, 9, 7), (7, 5, 3, 3), 2, 2, spatial.IM2COL),
]


@pytest.mark.parametrize("xs, ws, stride, padding, algorithm", FORWARD_CASES)
@pytest.mark.parametrize("epilogue", ["none", "bias", "bias_act", "residual"])
def test_conv2d_writes_into_out(xs, ws, stride, padding, algorithm, epilogue):
    """The forward into ``out``, with each part of the fused epilogue: bit for bit as without."""
    rng = np.random.default_rng(4)
    geo = ((stride, stride), (padding, padding), (1, 1), 1)
    x, w = rand(rng, xs), rand(rng, ws) * 0.3
    out_hw = NP.conv2d(x, w, *geo).shape
    assert spatial.conv_algorithm("forward", ws, *geo, xs[0], out_hw[2:]) == algorithm
    bias = None if epilogue in ("none", "residual") else rand(rng, (ws[0],))
    act = "silu" if epilogue == "bias_act" else "none"
    residual, scale = (rand(rng, out_hw), 0.7) if epilogue == "residual" else (None, 1.0)
    want = NB.conv2d(x, w, *geo, bias, act, residual, scale)
    np.testing.assert_allclose(want, NP.conv2d(x, w, *geo, bias, act, residual, scale), rtol=1e-9, atol=1e-9)
    out = np.full(out_hw, np.nan)
    assert_written((NB.conv2d(x, w, *geo, bias, act, residual, scale, out=out),), (out,), (want,))


GRAD_WEIGHT_CASES = [case[:4] + (spatial.IM2COL if case[4] == spatial.POINTWISE else case[4],)
                     for case in FORWARD_CASES]


@pytest.mark.parametrize("xs, ws, stride, padding, algorithm", GRAD_WEIGHT_CASES)
def test_conv2d_grad_weight_writes_into_out(xs, ws, stride, padding, algorithm):
    rng = np.random.default_rng(5)
    geo = ((stride, stride), (padding, padding), (1, 1), 1)
    x, w = rand(rng, xs), rand(rng, ws)
    grad = rand(rng, NP.conv2d(x, w, *geo).shape) * 0.3
    assert spatial.conv_algorithm("grad_weight", ws, *geo, xs[0], grad.shape[2:]) == algorithm
    want = NB.conv2d_grad_weight(grad, x, ws, *geo)
    np.testing.assert_allclose(want, NP.conv2d_grad_weight(grad, x, ws, *geo), rtol=1e-9, atol=1e-9)
    out = np.full(ws, np.nan)
    assert_written((NB.conv2d_grad_weight(grad, x, ws, *geo, out=out),), (out,), (want,))


def test_conv2d_grad_input_out_must_be_contiguous_of_the_input_shape():
    rng = np.random.default_rng(2)
    x, w = rand(rng, (2, 3, 5, 5)), rand(rng, (4, 3, 3, 3))
    grad = rand(rng, (2, 4, 5, 5))
    geo = ((1, 1), (1, 1), (1, 1), 1)
    for bad in (np.zeros((2, 3, 5, 4)), np.zeros((2, 3, 5, 5), np.float32), np.zeros((2, 3, 5, 5, 2))[..., 0]):
        kept = bad.copy()
        with pytest.raises(ValueError, match="conv2d_grad_input: out must be"):
            NB.conv2d_grad_input(grad, w, x.shape, *geo, out=bad)
        assert np.array_equal(bad, kept)


# ----- a compiled train step passes its planned buffers --------------------------------------
OUT_METHODS = ("group_norm", "group_norm_backward", "attention", "attention_backward", "conv2d_grad_input",
               "conv2d_grad_weight")


def _step(params: dict, x: tc.Tensor) -> tc.Tensor:
    """conv -> GroupNorm + SiLU -> attention over the pixels -> conv, a squared loss, backward
    (the gradients accumulate from call to call)."""
    h = F.conv2d(x, params["w1"], params["b1"], padding=1)
    h = F.silu(F.group_norm(h, 4, params["gn_w"], params["gn_b"]))
    n, c, hh, ww = h.shape
    tokens = h.reshape(n, c, hh * ww).transpose(1, 2).reshape(n, hh * ww, 2, c // 2).permute(0, 2, 1, 3)
    a = F.scaled_dot_product_attention(tokens, tokens, tokens)
    h = h + a.permute(0, 2, 1, 3).reshape(n, hh * ww, c).transpose(1, 2).reshape(n, c, hh, ww)
    y = F.conv2d(h, params["w2"], padding=1)
    loss = (y * y).mean()
    loss.backward()
    return loss


@pytest.mark.parametrize("native", [False, True])
def test_compiled_step_passes_planned_buffers_as_out_and_equals_eager(native, monkeypatch):
    """With native plans off every replay calls the methods with ``out``; with them on,
    the group norms run in native segments (``native_forms.py``) once compiled."""
    from tensorcore.backends.numba import native_plan

    monkeypatch.setenv("TENSORCORE_NATIVE_PLANS", "1" if native else "0")
    calls: dict[str, list[bool]] = {name: [] for name in OUT_METHODS}
    for name in OUT_METHODS:
        method = getattr(NumbaBackend, name)

        def recorded(self, *args, _method=method, _name=name, **kwargs):
            calls[_name].append(kwargs.get("out") is not None)
            return _method(self, *args, **kwargs)
        recorded.__wrapped__ = method  # the executor reads the signature (it takes out=)
        monkeypatch.setattr(NumbaBackend, name, recorded)

    def run(compiled: bool) -> tuple[list, list]:
        rng = np.random.default_rng(3)
        params = {"w1": rand(rng, (8, 3, 3, 3)) * 0.3, "b1": rand(rng, (8,)), "gn_w": rand(rng, (8,)),
                  "gn_b": rand(rng, (8,)), "w2": rand(rng, (2, 8, 3, 3)) * 0.3}
        with tc.use_backend("numba"):
            ps = {k: tc.tensor(v.astype(np.float32), requires_grad=True) for k, v in params.items()}
            step = tc.compile(lambda x: _step(ps, x), cache_dir=False) if compiled else (lambda x: _step(ps, x))
            losses = []
            for i in range(6):
                if i == 4:
                    native_plan.wait()
                x = tc.tensor(rand(rng, (2, 3, 6, 6)).astype(np.float32))
                losses.append(step(x).numpy().copy())
            if compiled:
                assert step.cache_info().hits >= 4
            return losses, [ps[k].grad.numpy().copy() for k in sorted(ps)]

    eager = run(False)
    for name in OUT_METHODS:
        calls[name].clear()
    compiled = run(True)
    for want, got in zip(eager[0] + eager[1], compiled[0] + compiled[1]):
        assert want.dtype == got.dtype and np.array_equal(want, got)
    for name in OUT_METHODS:  # the first calls trace (eager calls); the replays pass out
        if not native or not name.startswith("group_norm"):  # no native form: Python steps
            assert calls[name] and calls[name][-1], (name, calls[name])
