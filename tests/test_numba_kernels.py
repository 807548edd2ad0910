"""The Numba backend's kernels against the NumPy reference backend (and torch.optim
for the optimizer updates), on shapes that hit edge cases: size-1 dims, odd widths,
groups, stride > 1, dilation, padding larger than half the kernel.

Every kernel compiles once per dtype on first use (then loads from Numba's disk
cache), so the cases share kernels and stick to float32 and float64.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorcore.backends.numba import spatial
from tensorcore.backends.numba.backend import NumbaBackend
from tensorcore.backends.numpy.backend import NumpyBackend

NB, NP = NumbaBackend(), NumpyBackend()
DTYPES = [np.float32, np.float64]
ACTS = ["none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"]


def tol(dtype) -> dict:
    return dict(rtol=2e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-11)


def rand(shape, dtype, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def assert_same(fast, ref, dtype):
    """Equal values (within the dtype's tolerance) and dtypes, through tuples."""
    if isinstance(ref, tuple):
        assert isinstance(fast, tuple) and len(fast) == len(ref)
        for f, r in zip(fast, ref):
            assert_same(f, r, dtype)
        return
    if ref is None:
        assert fast is None
        return
    assert fast.shape == ref.shape and fast.dtype == ref.dtype
    np.testing.assert_allclose(fast, ref, **tol(dtype))


def check(method, *args, dtype):
    """The numba and numpy backends agree on ``method(*args)``."""
    fast = getattr(NB, method)(*args)
    ref = getattr(NP, method)(*args)
    assert_same(fast, ref, dtype)
    return fast


# ----- reductions -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, axes", [((64, 32, 8, 8), (0, 2, 3)), ((3, 70, 16), (0, 2)), ((70, 5, 4, 4), (0, -1, -2)),
                                         ((4, 3, 2, 5, 8), (0, 2, 3, 4)), ((40, 8, 16), (1, 2)), ((64, 10), (0,))])
@pytest.mark.parametrize("keepdims", [False, True])
def test_sum_over_all_but_one_axis(shape, axes, keepdims, dtype):
    """The per-channel sum kernel (bias gradients) against the reference and float64."""
    x = rand(shape, dtype, 3, 2.0) + 1.0  # an offset makes accumulation errors show
    got = check("reduce", "sum", x, axes, keepdims, dtype=dtype)
    np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=axes, keepdims=keepdims), **tol(dtype))


@given(shape=st.lists(st.integers(1, 9), min_size=2, max_size=5), first=st.integers(0, 4), count=st.integers(1, 4),
       keepdims=st.booleans(), dtype=st.sampled_from(DTYPES))
def test_sum_around_one_block_of_kept_axes(shape, first, count, keepdims, dtype):
    """Any sum whose kept axes are one block (per-sample sums of a bias add's gradient,
    [N, C] sums over the planes) against float64: the channel-sums kernel where 16 or
    more summed values follow the block."""
    shape = tuple(shape) + (16,)  # at least 16 summed values after any block that leaves the last axis
    first = min(first, len(shape) - 2)
    kept = range(first, min(first + count, len(shape) - 1))
    axes = tuple(ax for ax in range(len(shape)) if ax not in kept)
    x = rand(shape, dtype, 5) + 1.0
    got = check("reduce", "sum", x, axes, keepdims, dtype=dtype)
    np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=axes, keepdims=keepdims), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1024, 64), (64, 16, 64), (300, 7), (5000, 3)])
def test_sum_over_the_leading_axis_adds_as_numpy(shape, dtype):
    """A linear layer's bias gradient: NumPy's order of additions, so the same bits."""
    x = rand(shape, dtype, 6) + 1.0
    got = NB.reduce("sum", x, (0,), False)
    np.testing.assert_array_equal(got, x.sum(axis=0))
    assert got.dtype == dtype


# ----- activations ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
def test_bias_act_forward_backward(act, dtype):
    x, g = rand((3, 5, 7), dtype, 1, 3.0), rand((3, 5, 7), dtype, 2)
    for axis in (-1, 1, 0):
        bias = rand((x.shape[axis],), dtype, 3)
        out = check("bias_act", x, bias, act, axis, dtype=dtype)
        assert out.dtype == dtype
        check("bias_act_backward", g, x, bias, act, axis, dtype=dtype)
    check("activation_grad", act, x, g, dtype=dtype)
    if act in ("gelu", "gelu_tanh", "silu", "sigmoid"):
        check("unary", act, x, dtype=dtype)


def test_activations_extreme_inputs_are_exact_in_float32():
    x = np.array([-1e4, -100.0, -88.5, -20.0, -1e-30, 0.0, 20.0, 88.5, 100.0, 1e4], np.float32)
    x64, ones = x.astype(np.float64), np.ones_like(x)
    for act in ACTS:
        out = NB.bias_act(x, np.zeros(x.size, np.float32), act, 0)
        ref = NP.bias_act(x64, None, act, 0)
        assert out.dtype == np.float32 and np.all(np.isfinite(out))
        np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-30)
        grad = NB.activation_grad(act, x, ones)
        np.testing.assert_allclose(grad, NP.activation_grad(act, x64, ones.astype(np.float64)),
                                   rtol=2e-6, atol=1e-30)


def test_unknown_activation_raises():
    with pytest.raises(ValueError, match="activation"):
        NB.bias_act(np.ones((2, 2), np.float32), np.ones(2, np.float32), "swish", 1)


# ----- softmax family -------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 3, 33), (4, 200), (2, 128)])
def test_softmax_family(shape, dtype):
    x, g = rand(shape, dtype, 1, 4.0), rand(shape, dtype, 2)
    y = check("softmax", x, dtype=dtype)
    check("softmax_backward", g, y, dtype=dtype)
    logp = check("log_softmax", x, dtype=dtype)
    check("log_softmax_backward", g, logp, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_masked_rows(dtype):
    """-inf entries (attention masks) get exactly 0, wherever the row's max lies."""
    x = rand((3, 150), dtype, 1, 3.0)
    x[0, :100] = -np.inf
    x[1, 70:] = -np.inf
    x[2, ::3] = -np.inf
    y = check("softmax", x, dtype=dtype)
    assert np.all(y[np.isneginf(x)] == 0)
    check("log_softmax", x, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy(smoothing, dtype):
    logits = rand((6, 5), dtype, 1, 3.0)
    target = np.array([0, 4, -100, 2, 2, 1])
    loss, logp = check("cross_entropy", logits, target, -100, smoothing, dtype=dtype)
    assert loss[2] == 0
    check("cross_entropy_backward", rand((6,), dtype, 2), logp, target, -100, smoothing,
          dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction, smoothing", [("mean", 0.0), ("mean", 0.2), ("sum", 0.1)])
@pytest.mark.parametrize("rows", [1, 6, 300])
def test_cross_entropy_reduced(rows, reduction, smoothing, dtype):
    """One kernel each way against the reference's composition (300 rows: the
    parallel loop); every row ignored gives NaN and a zero gradient in both."""
    logits = rand((rows, 5), dtype, 1, 3.0)
    target = np.random.default_rng(rows).integers(0, 5, rows)
    target[::4] = -100
    for t in (target, np.full(rows, -100)):
        loss, logp, divisor = check("cross_entropy_reduced", logits, t, -100, smoothing, reduction, dtype=dtype)
        assert loss.shape == () and divisor.dtype == np.float64
        check("cross_entropy_reduced_backward", np.array(1.3, dtype), logp, t, -100, smoothing, divisor,
              dtype=dtype)
    assert np.isnan(loss) == (reduction == "mean")


def test_cross_entropy_rejects_out_of_range_targets():
    with pytest.raises(ValueError, match="cross_entropy"):
        NB.cross_entropy(np.zeros((2, 3), np.float32), np.array([0, 3]), -100, 0.0)
    logits, target = np.zeros((2, 3), np.float32), np.array([0, -2])
    with pytest.raises(ValueError, match="cross_entropy_reduced: target -2 is outside the 3 classes"):
        NB.cross_entropy_reduced(logits, target, -100, 0.0, "mean")
    with pytest.raises(ValueError, match="cross_entropy_reduced_backward: target -2"):
        NB.cross_entropy_reduced_backward(np.array(1, np.float32), logits, target, -100, 0.0, np.array(2.0))


# ----- normalisation --------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, n_norm", [((1, 1), 1), ((3, 5, 7), 2), ((4, 9), 1)])
def test_layer_norm(shape, n_norm, dtype):
    x, g = rand(shape, dtype, 1, 2.0) + 3, rand(shape, dtype, 2)
    norm_shape = shape[-n_norm:]
    for w, b in ((rand(norm_shape, dtype, 3), rand(norm_shape, dtype, 4)), (None, None)):
        y, mean, rstd = check("layer_norm", x, w, b, n_norm, 1e-5, dtype=dtype)
        check("layer_norm_backward", g, x, w, mean, rstd, n_norm, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, groups, act", [((2, 6, 5, 3), 3, "silu"), ((1, 4, 1, 1), 2, "none"),
                                                ((3, 4, 7), 4, "gelu"), ((2, 2, 3, 3), 1, "relu")])
def test_group_norm(shape, groups, act, dtype):
    x, g = rand(shape, dtype, 1, 2.0) - 1, rand(shape, dtype, 2)
    c = shape[1]
    for w, b in ((rand((c,), dtype, 3), rand((c,), dtype, 4)), (None, None)):
        y, mean, rstd = check("group_norm", x, w, b, groups, 1e-5, act, dtype=dtype)
        check("group_norm_backward", g, x, w, b, mean, rstd, groups, act, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 3, 5, 7), (2, 1, 1, 1), (3, 5)])
def test_batch_norm(shape, dtype):
    x, g = rand(shape, dtype, 1, 2.0) + 1, rand(shape, dtype, 2)
    c = shape[1]
    w, b = rand((c,), dtype, 3), rand((c,), dtype, 4)
    for training in (True, False):
        stats_fast = [np.full(c, 0.5, dtype), np.full(c, 2.0, dtype)]
        stats_ref = [s.copy() for s in stats_fast]
        fast = NB.batch_norm(x, w, b, *stats_fast, training, 0.1, 1e-5)
        ref = NP.batch_norm(x, w, b, *stats_ref, training, 0.1, 1e-5)
        assert_same(fast, ref, dtype)
        assert_same(tuple(stats_fast), tuple(stats_ref), dtype)
        _, mean, rstd = ref
        check("batch_norm_backward", g, x, w, mean, rstd, training, dtype=dtype)
        check("batch_norm_backward", g, x, None, mean, rstd, training, dtype=dtype)


def test_norm_statistics_survive_a_large_offset():
    x = (np.random.default_rng(0).standard_normal((2, 50_000)) + 1e4).astype(np.float32)
    _, mean, rstd = NB.layer_norm(x, None, None, 1, 0.0)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(mean, x64.mean(1), rtol=1e-7)
    np.testing.assert_allclose(rstd, 1 / x64.std(1), rtol=1e-4)


# ----- convolution ----------------------------------------------------------------
CONV_CASES = [
    ((1, 1, 1, 1), (1, 1, 1, 1), (1, 1), (0, 0), (1, 1), 1),
    ((2, 3, 7, 5), (4, 3, 3, 3), (2, 1), (1, 2), (1, 1), 1),
    ((2, 4, 9, 8), (6, 2, 3, 2), (1, 2), (2, 1), (2, 3), 2),
    ((1, 2, 5, 5), (2, 2, 3, 3), (1, 1), (3, 2), (1, 1), 1),
    ((2, 6, 6, 7), (6, 1, 3, 3), (2, 2), (1, 1), (1, 1), 6),
    ((3, 2, 4, 4), (4, 2, 1, 1), (1, 1), (0, 0), (1, 1), 1),
    ((1, 3, 11, 1), (3, 1, 5, 1), (3, 1), (4, 0), (2, 1), 3),
    # stride 1 with Wo == W: each tap is one shifted copy of the plane
    ((2, 3, 6, 5), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((2, 3, 6, 5), (4, 3, 5, 3), (1, 1), (0, 1), (1, 1), 1),
    ((2, 4, 5, 7), (4, 2, 3, 3), (1, 1), (2, 2), (2, 2), 2),
    ((2, 3, 4, 6), (2, 3, 3, 3), (1, 1), (4, 1), (1, 1), 1),
    ((1, 2, 1, 1), (3, 2, 3, 3), (1, 1), (1, 1), (1, 1), 1),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONV_CASES)
def test_conv2d_and_grads(xs, ws, stride, padding, dilation, groups, dtype):
    x, w = rand(xs, dtype, 1), rand(ws, dtype, 2)
    out = check("conv2d", x, w, stride, padding, dilation, groups, dtype=dtype)
    g = rand(out.shape, dtype, 3)
    check("conv2d_grad_input", g, w, xs, stride, padding, dilation, groups, dtype=dtype)
    check("conv2d_grad_weight", g, x, ws, stride, padding, dilation, groups, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
@pytest.mark.parametrize("xs, ws, groups", [((5, 1, 30, 30), (3, 1, 3, 3), 1),  # blocks of 4 images + 1
                                            ((3, 1, 70, 70), (3, 1, 3, 3), 1),  # planes over a block
                                            ((4, 16, 6, 5), (8, 16, 3, 3), 1)])  # the BLAS path
def test_conv2d_bias_act_written_with_the_output(xs, ws, groups, act, dtype):
    """The short-contraction path works on blocks of images (a partial last one, or one
    plane larger than a block) and, like the BLAS path, adds the bias and applies the
    activation as it writes NCHW; the weight gradient gathers the same blocks."""
    x, w, bias = rand(xs, dtype, 1), rand(ws, dtype, 2), rand((ws[0],), dtype, 3)
    geo = ((1, 1), (1, 1), (1, 1), groups)
    out = check("conv2d", x, w, *geo, bias, act, dtype=dtype)
    check("conv2d_grad_weight", rand(out.shape, dtype, 4), x, ws, *geo, dtype=dtype)


@given(n=st.integers(1, 3), c=st.integers(1, 4), h=st.integers(1, 9), w=st.integers(1, 9),
       cout=st.integers(1, 4), kh=st.integers(1, 4), kw=st.integers(1, 4),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       padding=st.tuples(st.integers(0, 4), st.integers(0, 4)),
       dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)))
def test_conv2d_geometries_match_reference(n, c, h, w, cout, kh, kw, stride, padding, dilation):
    """Random geometries in float64: forward, both gradients and the transposed
    convolution (which runs the input-gradient kernels)."""
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if ho < 1 or wo < 1:
        return
    x, wt = rand((n, c, h, w), np.float64, 1), rand((cout, c, kh, kw), np.float64, 2)
    geo = (stride, padding, dilation, 1)
    out = check("conv2d", x, wt, *geo, dtype=np.float64)
    g = rand(out.shape, np.float64, 3)
    check("conv2d_grad_input", g, wt, x.shape, *geo, dtype=np.float64)
    check("conv2d_grad_weight", g, x, wt.shape, *geo, dtype=np.float64)


# Thin convolutions (one output channel per group, or up to FEW_OUT_MAX for stride-1
# kernels larger than 1x1) run direct loops in all three passes, checked against the
# float64 reference.
def assert_close_to_f64(fast, ref, dtype):
    """fast (in ``dtype``) matches the float64 ``ref``: to rounding in float64, to a
    few float32 roundings of the output's magnitude in float32."""
    assert fast.dtype == dtype and fast.shape == ref.shape
    atol = (1e-11 if dtype == np.float64 else 1e-5) * max(1.0, np.abs(ref).max())
    np.testing.assert_allclose(fast, ref, rtol=0, atol=atol)


@pytest.mark.parametrize("pass_name", ["forward", "grad_input", "grad_weight"])
def test_thin_convolutions_take_the_direct_loops(pass_name):
    few = spatial.FEW_OUT_MAX
    cases = [  # w shape, stride, groups, direct loops?
        ((1, 32, 3, 3), (1, 1), 1, True), ((few, 32, 3, 3), (1, 1), 1, True),
        ((2 * few, 16, 3, 3), (1, 1), 2, True), ((few + 1, 32, 3, 3), (1, 1), 1, False),
        ((1, 32, 1, 1), (1, 1), 1, True), ((2, 32, 1, 1), (1, 1), 1, False),
        ((1, 32, 3, 3), (2, 2), 1, True), ((2, 32, 3, 3), (2, 1), 1, False),
        ((32, 1, 3, 3), (1, 1), 32, True),
    ]
    for ws, stride, groups, direct in cases:
        chosen = spatial.conv_algorithm(pass_name, ws, stride, (1, 1), (1, 1), groups, 64,
                                        (8, 8))
        assert (chosen == spatial.FEW_OUT) == direct, (ws, stride, groups)


@given(n=st.sampled_from([1, 2, 5]), groups=st.integers(1, 2), cin_g=st.integers(1, 3),
       cout_g=st.integers(1, spatial.FEW_OUT_MAX), k=st.sampled_from([1, 3]),
       hw=st.tuples(st.integers(1, 9), st.integers(1, 9)),
       stride=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       padding=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       dtype=st.sampled_from(DTYPES))
def test_thin_convolutions_match_reference(n, groups, cin_g, cout_g, k, hw, stride, padding,
                                           dilation, dtype):
    """All three passes over stride, padding, dilation, groups and kernel size."""
    if stride != (1, 1) or k == 1:
        cout_g = 1  # the only thin case these geometries route to the direct loops
    out_hw = [(hw[i] + 2 * padding[i] - dilation[i] * (k - 1) - 1) // stride[i] + 1
              for i in range(2)]
    if min(out_hw) < 1:
        return
    xs, ws = (n, cin_g * groups) + hw, (cout_g * groups, cin_g, k, k)
    geo = (stride, padding, dilation, groups)
    assert spatial.conv_algorithm("forward", ws, *geo, n, out_hw) == spatial.FEW_OUT
    x, w, g = rand(xs, dtype, 1), rand(ws, dtype, 2), rand((n, ws[0], *out_hw), dtype, 3)
    x64, w64, g64 = x.astype(np.float64), w.astype(np.float64), g.astype(np.float64)
    assert_close_to_f64(NB.conv2d(x, w, *geo), NP.conv2d(x64, w64, *geo), dtype)
    assert_close_to_f64(NB.conv2d_grad_input(g, w, xs, *geo),
                        NP.conv2d_grad_input(g64, w64, xs, *geo), dtype)
    assert_close_to_f64(NB.conv2d_grad_weight(g, x, ws, *geo),
                        NP.conv2d_grad_weight(g64, x64, ws, *geo), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["relu", "silu", "tanh"])
def test_thin_conv2d_bias_act_and_out(act, dtype):
    """The forward's epilogue adds the bias and applies the activation as it writes;
    out= receives the result.  The blocks of images end in a partial one."""
    xs, ws, geo = (23, 8, 9, 9), (2, 4, 3, 3), ((1, 1), (1, 1), (1, 1), 2)
    x, w, bias = rand(xs, dtype, 1), rand(ws, dtype, 2), rand((ws[0],), dtype, 3)
    ref = NP.conv2d(x.astype(np.float64), w.astype(np.float64), *geo,
                    bias.astype(np.float64), act)
    assert_close_to_f64(NB.conv2d(x, w, *geo, bias, act), ref, dtype)
    out = np.full(ref.shape, np.nan, dtype)
    assert NB.conv2d(x, w, *geo, bias, act, out=out) is out
    assert_close_to_f64(out, ref, dtype)


# Winograd F(4x4, 3x3): called directly on small shapes (the backend takes it only for
# large convolutions); float32 rounds to a few 1e-6 of the output's magnitude.
def assert_winograd_close(fast, ref, dtype):
    """fast (in ``dtype``) matches the float64 ``ref`` to the transforms' rounding."""
    assert fast.dtype == dtype and fast.shape == ref.shape
    atol = (1e-10 if dtype == np.float64 else 2e-5) * max(1.0, np.abs(ref).max())
    np.testing.assert_allclose(fast, ref, rtol=0, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("xs, cout, padding", [((2, 3, 8, 8), 4, (1, 1)), ((1, 2, 7, 9), 3, (0, 2)),
                                               ((3, 1, 5, 3), 2, (2, 1)), ((1, 2, 3, 4), 1, (0, 0)),
                                               ((2, 2, 1, 2), 2, (1, 2))])
@pytest.mark.parametrize("batch", [False, True])  # winograd's / winograd_batch's layout
def test_winograd_matches_direct_convolution(xs, cout, padding, dtype, batch):
    from tensorcore.backends.numba.kernels.activations import ACT_CODES
    from tensorcore.backends.numba.kernels.winograd import weight_tiles

    x, w = rand(xs, dtype, 1), rand((cout, xs[1], 3, 3), dtype, 2, 0.3)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    geo = ((1, 1), padding, (1, 1), 1)
    ref = NP.conv2d(x64, w64, *geo)
    if batch:
        y = spatial._winograd_batch_conv(NB.scratch, x, weight_tiles(w.transpose(1, 0, 2, 3)), padding,
                                         np.empty(ref.shape, dtype), np.zeros(cout, dtype), ACT_CODES["none"])
    else:
        y = spatial._winograd_conv(NB.scratch, x, weight_tiles(w), padding, np.empty(ref.shape, dtype))
    assert_winograd_close(y, ref, dtype)
    g = rand(ref.shape, dtype, 3)
    assert_winograd_close(spatial._winograd_weight_grad(NB.scratch, g, x, padding, batch),
                          NP.conv2d_grad_weight(g.astype(np.float64), x64, w.shape, *geo), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padding", [(1, 1), (2, 0), (3, 1)])
def test_conv2d_takes_winograd_for_large_3x3(padding, dtype):
    """A shape the backend runs through Winograd (padding 3 leaves the input gradient
    on im2col), all three passes against the float64 reference."""
    xs, ws = (16, 64, 29, 31), (64, 64, 3, 3)
    geo = ((1, 1), padding, (1, 1), 1)
    out_hw = (xs[2] + 2 * padding[0] - 2, xs[3] + 2 * padding[1] - 2)
    for pass_name in ("forward", "grad_weight"):
        assert spatial.conv_algorithm(pass_name, ws, (1, 1), padding, (1, 1), 1, xs[0],
                                      out_hw) == spatial.WINOGRAD
    expected = spatial.WINOGRAD if max(padding) <= 2 else spatial.IM2COL
    assert spatial.conv_algorithm("grad_input", ws, (1, 1), padding, (1, 1), 1, xs[0],
                                  xs[2:]) == expected
    x, w = rand(xs, dtype, 1), rand(ws, dtype, 2, 0.1)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    assert_winograd_close(NB.conv2d(x, w, *geo), NP.conv2d(x64, w64, *geo), dtype)
    g = rand((xs[0], ws[0]) + out_hw, dtype, 3, 0.1)
    g64 = g.astype(np.float64)
    assert_winograd_close(NB.conv2d_grad_input(g, w, xs, *geo),
                          NP.conv2d_grad_input(g64, w64, xs, *geo), dtype)
    assert_winograd_close(NB.conv2d_grad_weight(g, x, ws, *geo),
                          NP.conv2d_grad_weight(g64, x64, ws, *geo), dtype)


def test_conv2d_rejects_mismatched_channels():
    with pytest.raises(ValueError, match="conv2d"):
        NB.conv2d(np.ones((1, 3, 4, 4), np.float32), np.ones((2, 2, 3, 3), np.float32),
                  (1, 1), (0, 0), (1, 1), 1)


# ----- pooling and upsampling -----------------------------------------------------
POOL_CASES = [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)), ((3, 2), (1, 2), (1, 1)),
              ((1, 1), (1, 1), (0, 0)), ((5, 3), (3, 1), (2, 0))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel, stride, padding", POOL_CASES)
def test_pooling(kernel, stride, padding, dtype):
    x = rand((2, 3, 7, 5), dtype, 1)
    out, arg = check("max_pool2d", x, kernel, stride, padding, dtype=dtype)
    np.testing.assert_array_equal(arg, NP.max_pool2d(x, kernel, stride, padding)[1])
    g = rand(out.shape, dtype, 2)
    check("max_pool2d_backward", g, arg, x.shape, dtype=dtype)
    avg = check("avg_pool2d", x, kernel, stride, padding, dtype=dtype)
    check("avg_pool2d_backward", rand(avg.shape, dtype, 3), x.shape, kernel, stride, padding,
          dtype=dtype)


def test_max_pool_ties_pick_the_first_and_nan_propagates():
    x = np.zeros((1, 1, 4, 4), np.float32)
    x[0, 0, 1, 1] = np.nan
    out, arg = NB.max_pool2d(x, (2, 2), (2, 2), (0, 0))
    ref_out, ref_arg = NP.max_pool2d(x, (2, 2), (2, 2), (0, 0))
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(arg, ref_arg)
    assert np.isnan(out[0, 0, 0, 0]) and arg[0, 0, 0, 1] == 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_max_pool_many_small_planes(dtype):
    """Backward tasks take several planes each (210 planes of 64, a partial last task);
    a window of -inf only reports its first position, as the reference does."""
    x = rand((3, 70, 8, 8), dtype, 4)
    x[1, 5, 2:4, 4:6] = -np.inf
    out, arg = check("max_pool2d", x, (2, 2), (2, 2), (0, 0), dtype=dtype)
    np.testing.assert_array_equal(arg, NP.max_pool2d(x, (2, 2), (2, 2), (0, 0))[1])
    check("max_pool2d_backward", rand(out.shape, dtype, 5), arg, x.shape, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel, stride, padding", POOL_CASES)
def test_max_pool_nan_ties_and_infinities_match_the_reference(kernel, stride, padding, dtype):
    """Windows drawn from a few values, so most hold ties, NaNs (several in one window:
    the last one wins), -inf only or +inf: values and argmax equal the reference's
    exactly, on the 2x2 halving path and the general one."""
    values = np.array([np.nan, -np.inf, np.inf, -1.0, 0.0, 1.0, 1.0, 2.0], dtype)
    x = np.random.default_rng(7).choice(values, size=(2, 5, 8, 7))
    x[0, 0] = -np.inf
    out, arg = NB.max_pool2d(x, kernel, stride, padding)
    ref_out, ref_arg = NP.max_pool2d(x, kernel, stride, padding)
    assert out.dtype == ref_out.dtype
    np.testing.assert_array_equal(out, ref_out)  # NaNs compare equal here
    np.testing.assert_array_equal(arg, ref_arg)
    assert np.isnan(out).any() and np.isinf(out).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_hw, out_hw", [((4, 5), (8, 10)), ((3, 3), (7, 4)), ((1, 1), (3, 2)),
                                           ((5, 4), (2, 3))])
def test_upsampling(in_hw, out_hw, dtype):
    x = rand((2, 3) + in_hw, dtype, 1)
    out = check("upsample_nearest2d", x, out_hw, dtype=dtype)
    check("upsample_nearest2d_backward", rand(out.shape, dtype, 2), x.shape, dtype=dtype)
    for align in (False, True):
        out = check("upsample_bilinear2d", x, out_hw, align, dtype=dtype)
        check("upsample_bilinear2d_backward", rand(out.shape, dtype, 3), x.shape, align,
              dtype=dtype)


# ----- embedding ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_backward_accumulates_repeats(dtype):
    indices = np.array([[0, 3, 3, 1], [4, 3, 0, 0], [2, 2, 2, 2]])
    check("embedding_backward", rand((3, 4, 5), dtype, 1), indices, 6, dtype=dtype)
    with pytest.raises(ValueError, match="embedding_backward"):
        NB.embedding_backward(rand((2, 5), dtype), np.array([0, 6]), 6)


# ----- optimizer updates ----------------------------------------------------------
N_PARAMS = 37
RANGES = np.array([[0, 10], [12, 30], [30, 37]])  # [10, 12) is alignment padding


def _optimizer_calls(dtype):
    """name -> (number of state buffers, update(backend, p, g, states, lr, step))."""
    return {
        "sgd": (1, lambda B, p, g, s, lr, step: B.sgd_update_(
            p, g, s[0], lr, 0.9, 0.1, False, 0.01, (step == 1).astype(dtype))),
        "sgd_nesterov": (1, lambda B, p, g, s, lr, step: B.sgd_update_(
            p, g, s[0], lr, 0.9, 0.0, True, 0.0, (step == 1).astype(dtype))),
        "adam": (2, lambda B, p, g, s, lr, step: B.adam_update_(
            p, g, s[0], s[1], None, lr, step, 0.9, 0.999, 1e-8, 0.01, False)),
        "adamw_amsgrad": (3, lambda B, p, g, s, lr, step: B.adam_update_(
            p, g, s[0], s[1], s[2], lr, step, 0.8, 0.99, 1e-8, 0.1, True)),
        "rmsprop_centered": (3, lambda B, p, g, s, lr, step: B.rmsprop_update_(
            p, g, s[0], s[1], s[2], lr, 0.9, 1e-8, 0.01, 0.5, True)),
        "adagrad": (1, lambda B, p, g, s, lr, step: B.adagrad_update_(
            p, g, s[0], lr, step, 0.1, 0.01, 1e-10)),
        "lamb": (2, lambda B, p, g, s, lr, step: B.lamb_update_(
            p, g, s[0], s[1], RANGES, lr, step, 0.9, 0.999, 1e-6, 0.01)),
        "lars": (1, lambda B, p, g, s, lr, step: B.lars_update_(
            p, g, s[0], RANGES, lr, 0.9, 0.01, 1e-3, 1e-9)),
        "lion": (1, lambda B, p, g, s, lr, step: B.lion_update_(p, g, s[0], lr, 0.9, 0.99, 0.1)),
    }


def _run_updates(backend, update, n_states, dtype, steps=3):
    rng = np.random.default_rng(0)
    p = rng.standard_normal(N_PARAMS).astype(dtype)
    p[10:12] = 0
    states = [np.zeros(N_PARAMS, dtype) for _ in range(n_states)]
    lr = np.array([0.05], dtype)
    for k in range(steps):
        g = rng.standard_normal(N_PARAMS).astype(dtype)
        g[10:12] = 0
        update(backend, p, g, states, lr, np.array([k + 1], dtype))
    return p, states


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(_optimizer_calls(np.float32)))
def test_optimizer_updates_match_reference(name, dtype):
    n_states, update = _optimizer_calls(dtype)[name]
    p_fast, s_fast = _run_updates(NB, update, n_states, dtype)
    p_ref, s_ref = _run_updates(NP, update, n_states, dtype)
    assert_same(p_fast, p_ref, dtype)
    assert_same(tuple(s_fast), tuple(s_ref), dtype)
    assert not p_fast[10:12].any()


def test_optimizer_ranges_are_checked():
    p = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="lamb_update_"):
        NB.lamb_update_(p, p.copy(), p.copy(), p.copy(), np.array([[0, 5]]), np.ones(1, np.float32),
                        np.ones(1, np.float32), 0.9, 0.999, 1e-6, 0.0)


TORCH_OPTIMIZERS = {
    "sgd": (lambda ps, optim: optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
            "sgd"),
    "sgd_nesterov": (lambda ps, optim: optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True), "sgd_nesterov"),
    "adam": (lambda ps, optim: optim.Adam(ps, lr=0.05, weight_decay=0.01), "adam"),
    "adamw_amsgrad": (lambda ps, optim: optim.AdamW(ps, lr=0.05, betas=(0.8, 0.99), weight_decay=0.1,
                                                    amsgrad=True), "adamw_amsgrad"),
    "rmsprop_centered": (lambda ps, optim: optim.RMSprop(ps, lr=0.05, alpha=0.9, weight_decay=0.01,
                                                         momentum=0.5, centered=True), "rmsprop_centered"),
    "adagrad": (lambda ps, optim: optim.Adagrad(ps, lr=0.05, lr_decay=0.1, weight_decay=0.01), "adagrad"),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(TORCH_OPTIMIZERS))
def test_optimizer_updates_match_torch(name, dtype):
    torch = pytest.importorskip("torch")
    make, key = TORCH_OPTIMIZERS[name]
    n_states, update = _optimizer_calls(dtype)[key]
    p_fast, _ = _run_updates(NB, update, n_states, dtype)
    rng = np.random.default_rng(0)
    param = torch.tensor(rng.standard_normal(N_PARAMS).astype(dtype))
    param[10:12] = 0
    param.requires_grad_(True)
    opt = make([param], torch.optim)
    for _ in range(3):
        g = rng.standard_normal(N_PARAMS).astype(dtype)
        g[10:12] = 0
        param.grad = torch.tensor(g)
        opt.step()
    np.testing.assert_allclose(p_fast, param.detach().numpy(), **tol(dtype))


def test_empty_cache_frees_the_convolution_scratch():
    nb = NumbaBackend()
    x, w = rand((2, 3, 6, 6), np.float32, 1), rand((6, 3, 3, 3), np.float32, 2)  # im2col
    geo = ((1, 1), (1, 1), (1, 1), 1)
    first = nb.conv2d(x, w, *geo).copy()
    assert nb.scratch._buffers
    nb.empty_cache()
    assert not nb.scratch._buffers
    np.testing.assert_array_equal(nb.conv2d(x, w, *geo), first)
