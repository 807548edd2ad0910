"""GroupNorm applied inside the implicit-GEMM convolution's pack (backends/cupy/conv_norm.py):
bit for bit the eager GroupNorm, then the convolution, and against the NumPy backend in
float64.

The bound is the convolution's (test_cuda_conv.py) with the normalized input's own error
added to each product's: the statistics in float32 (a few ulps of the accumulation type,
``STATS``), the shifted input rounded to the dtype as eager rounds it (so the reference
rounds it too), and the normalized value rounded to the dtype as the pack stores it
(``stored``).  The magnitude of a normalized value is that of its terms,
``|xhat * weight| + |bias|``, through the activation's slope.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tensorcore as tc
from test_cuda_conv import ACT_SLOPE, MODES, RNG, on_gpu, precision, ran_implicit_gemm, rounded

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

from tensorcore.backends.cupy import conv_plan, counters  # noqa: E402
from tensorcore.backends.cupy.backend import CupyBackend  # noqa: E402
from tensorcore.backends.numpy.backend import NumpyBackend  # noqa: E402

GPU, REF = CupyBackend(), NumpyBackend()
STATS = 2.0**-18  # relative error of float32 mean / rstd over up to ~10^5 values


def normalized_reference(x, weight, bias, groups, act, shift, mode):
    """(y, |terms| of y) in float64: x + shift rounded to the dtype (eager's add), then
    GroupNorm and the activation."""
    xs = rounded(x + shift[:, :, None, None], mode) if shift is not None else x
    n, c = x.shape[:2]
    grouped = xs.reshape(n, groups, -1)
    xhat = ((grouped - grouped.mean(-1, keepdims=True))
            / np.sqrt(grouped.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    w = np.ones(c) if weight is None else weight
    b = np.zeros(c) if bias is None else bias
    affine = xhat * w[:, None, None] + b[:, None, None]
    y = REF.unary(act, affine) if act != "none" else affine
    terms = ACT_SLOPE * (np.abs(xhat * w[:, None, None]) + np.abs(b[:, None, None]))
    return y, terms


def check(xs, cout, k, stride, padding, groups, act, affine, shifted, mode, epilogue=False, seed=0) -> bool:
    """Bound the fused call against float64 and compare it with the two eager calls;
    returns whether it ran fused (the GroupNorm kernel did not run)."""
    rng = np.random.default_rng(seed)
    n, c = xs[:2]
    geo = ((stride, stride), (padding, padding), (1, 1), 1)
    x = rounded(rng.standard_normal(xs) * 2 + 0.5, mode)
    w = rounded(rng.standard_normal((cout, c, k, k)), mode)
    weight = rounded(rng.standard_normal(c), mode) if affine else None
    bias = rounded(rng.standard_normal(c), mode) if affine else None
    shift = rounded(rng.standard_normal((n, c)), mode) if shifted else None
    y, terms = normalized_reference(x, weight, bias, groups, act, shift, mode)
    conv = REF.conv2d(y, w, *geo)
    conv_bias = rounded(rng.standard_normal(cout), mode) if epilogue else np.zeros(cout)
    residual = rounded(rng.standard_normal(conv.shape), mode) if epilogue else np.zeros(conv.shape)
    want = conv + conv_bias[None, :, None, None] + residual
    summands = np.abs(conv) + np.abs(conv_bias)[None, :, None, None] + np.abs(residual)
    gpu = lambda a: None if a is None else on_gpu(a, mode)  # noqa: E731
    norm = (gpu(weight), gpu(bias), groups, 1e-5, act, gpu(shift))
    gx, gw = on_gpu(x, mode), on_gpu(w, mode)
    epilogue_args = dict(bias=gpu(conv_bias), residual=gpu(residual)) if epilogue else {}
    with precision(mode):
        with mock.patch.object(GPU, "group_norm", wraps=GPU.group_norm) as group_norm:
            got = GPU.group_norm_conv2d(gx, norm, gw, *geo, **epilogue_args)
        eager = GPU.conv2d(GPU.group_norm(gx, *norm)[0], gw, *geo, **epilogue_args)
    assert cp.array_equal(got, eager), "not the eager result bit for bit"
    _, _, product, stored = MODES[mode]
    terms_count = c * k * k
    magnitude = REF.conv2d(terms, np.abs(w), *geo)
    bound = 2 * ((product + stored + STATS + 2 * terms_count * 2.0**-24) * magnitude
                 + 2 * stored * summands) + (2.0**-24 if mode == "fp16" else 1e-30)
    got = cp.asnumpy(got).astype(np.float64)
    excess = np.abs(got - want) / bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess.max() <= 1.0, (f"{mode}: error {abs(got - want)[worst]:.3g} at {worst} exceeds "
                                 f"bound {bound[worst]:.3g} (want {want[worst]:.6g})")
    return not group_norm.called


@st.composite
def cases(draw):
    """Planes of 8 and 16 columns (whole 16-byte packs in every dtype) and of 5."""
    groups, per_group = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 2, 3, 8]))
    h, w = draw(st.integers(1, 12)), draw(st.sampled_from([5, 8, 16]))
    k, stride = draw(st.sampled_from([3, 1])), draw(st.integers(1, 2))
    # a 1x1 convolution without stride or padding is a plain GEMM on NCHW (cuBLAS, no pack)
    padding = 1 if k == 3 or stride == 1 else draw(st.integers(0, 1))
    return dict(xs=(draw(st.integers(1, 3)), groups * per_group, h, w), cout=draw(st.integers(1, 19)),
                k=k, stride=stride, padding=padding, groups=groups,
                act=draw(st.sampled_from(["none", "silu", "gelu", "relu"])), affine=draw(st.booleans()),
                shifted=draw(st.booleans()), epilogue=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


@pytest.mark.parametrize("mode", MODES)
@given(case=cases())
def test_normalized_conv_matches_eager_and_float64(mode, case):
    """Fused where planes are whole 16-byte packs (eager's cluster GroupNorm runs on all
    of these small tensors), else the two calls; the same result either way."""
    n, c, h, w = case["xs"]
    conv_plan.reset_stats()
    fused = check(**case, mode=mode)
    assert fused == (h * w % (16 // np.dtype(MODES[mode][0]).itemsize) == 0)
    assert ran_implicit_gemm("forward")


@pytest.mark.parametrize("mode", ["tf32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 128, 64, 64), (1, 256, 32, 32), (1, 512, 16, 16), (2, 64, 16, 16),
                                   (1, 256, 128, 128)])
def test_unet_sized_inputs_run_fused_and_equal_eager(mode, shape):
    """The last shape's groups are too large for the cluster kernel: eager runs the
    resident one, which then gives the coefficients itself."""
    for shifted in (False, True):
        assert check(shape, 32, 3, 1, 1, 32, "silu", True, shifted, mode, epilogue=True, seed=shape[1])


@pytest.mark.parametrize("mode", ["tf32", "bf16", "fp16"])
def test_a_norm_eager_runs_in_two_passes_is_folded_too(mode):
    """64 MB and more, groups of 4 Mi values: too large for both one-pass kernels, so eager
    GroupNorm runs the two-pass plane kernels (a VAE decoder's at 512²).  The fused call
    takes eager's own statistics kernel, then the apply kernel's coefficients."""
    assert check((1, 32, 1024, 1024), 8, 1, 2, 0, 8, "silu", True, True, mode, epilogue=True, seed=5)


@pytest.mark.parametrize("shape, groups", [((1, 6, 3, 3), 3), ((1, 8, 4, 4), 2)])
def test_uncovered_layouts_take_the_two_calls(shape, groups):
    """A group of 2 x 9 float32 values is not a whole number of packs; a channels-last x is
    not what the statistics kernel reads.  Both run GroupNorm, then the convolution."""
    x = cp.asarray(RNG.standard_normal(shape).astype(np.float32))
    if shape[1] == 8:
        x = cp.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    w = cp.asarray(RNG.standard_normal((4, shape[1], 3, 3)).astype(np.float32))
    norm = (None, None, groups, 1e-5, "silu", None)
    assert GPU._group_norm_in(x, norm, w, (1, 1), (1, 1), (1, 1), 1) is None
    got = GPU.group_norm_conv2d(x, norm, w, (1, 1), (1, 1), (1, 1), 1)
    want = GPU.conv2d(GPU.group_norm(x, *norm)[0], w, (1, 1), (1, 1), (1, 1), 1)
    cp.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_captured_normalized_conv_replays_as_eager():
    """The last block of each statistic resets its arrival counter, so a graph replays the
    statistics kernel: each replay on new data equals the eager call."""
    x = cp.asarray(RNG.standard_normal((2, 64, 32, 32)).astype(np.float32))
    w = cp.asarray(RNG.standard_normal((16, 64, 3, 3)).astype(np.float32))
    shift = cp.asarray(RNG.standard_normal((2, 64)).astype(np.float32))
    norm = (None, None, 8, 1e-5, "silu", shift)
    step = lambda: GPU.group_norm_conv2d(x, norm, w, (1, 1), (1, 1), (1, 1), 1)  # noqa: E731
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        step()  # warm: compile, size the scratch buffer and the counters
        stream.synchronize()
        stream.begin_capture()
        captured = step()
        graph = stream.end_capture()
        for _ in range(3):
            for a in (x, shift):
                a[...] = cp.asarray(RNG.standard_normal(a.shape).astype(np.float32))
            graph.launch(stream)
            eager = step()
            stream.synchronize()
            assert cp.array_equal(captured, eager)
            assert int(counters.arrival_counters(16).sum()) == 0


def test_a_compiled_unet_folds_its_norms_into_the_convolutions():
    import diffusion

    with tc.use_backend("cupy"):
        tc.manual_seed(0)
        model = diffusion.UNet2D(sample_size=16, in_channels=4, out_channels=4, block_out_channels=(32, 64),
                                 layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                 up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8).eval()
        x, t = tc.randn(1, 4, 16, 16), tc.tensor([10.0])
        with tc.no_grad():
            compiled = tc.compile(model, cache_dir=False)
            compiled(x, t)
            got = compiled(x, t)
            want = model(x, t)
            off = tc.compile(model, cache_dir=False, passes={"fuse_norm_conv": False})
            off(x, t)
            apart = off(x, t)
        assert compiled.plan_info()[0]["passes"]["fuse_norm_conv"] >= 5
        got, want, apart = (getattr(o, "sample", o).numpy() for o in (got, want, apart))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, apart, rtol=1e-4, atol=1e-4)
