"""The implicit-GEMM convolution kernels (backends/cupy/conv_igemm.py) against the NumPy
backend in float64.

Each dtype gets a bound derived from the arithmetic the kernels do.  With ``terms``
products per output and ``|x| * |w|`` the float64 convolution of the absolute values:

    |got - want| <= 2 * ((product + 2 * terms * 2^-24) * (|x| * |w|) + stored * |want|)

``product`` is the relative error of one product: 0 for bfloat16 / float16 (their
products are exact in float32), 2^-10 for TF32 (both operands rounded to 11 bits),
2^-20 for 3xTF32 (the dropped small * small term and the small parts' rounding);
``2 * terms * 2^-24`` bounds the float32 accumulation; ``stored`` is the output's
rounding (2^-24, 2^-11 for float16, 2^-8 for bfloat16), plus float16's subnormal
spacing 2^-24 for results that small.  The reference is computed from the inputs
rounded to the dtype, so input rounding is not part of the error.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tensorcore as tc
from tensorcore import settings

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

from tensorcore.backends.cupy import conv_halo, conv_plan, loader  # noqa: E402
from tensorcore.backends.cupy.backend import CupyBackend  # noqa: E402
from tensorcore.backends.numpy.backend import NumpyBackend  # noqa: E402

GPU, REF = CupyBackend(), NumpyBackend()
RNG = np.random.default_rng(7)

# mode: (dtype, matmul precision, product error, stored-output rounding)
MODES = {
    "fp32": (np.float32, "highest", 2.0**-20, 2.0**-24),
    "tf32": (np.float32, "high", 2.0**-10, 2.0**-24),
    "bf16": (tc.bfloat16, "highest", 0.0, 2.0**-8),
    "fp16": (np.float16, "highest", 0.0, 2.0**-11),
}
ACT_SLOPE = 1.2  # the largest |d act / dx| of the activations (GELU's is 1.13)


@contextlib.contextmanager
def precision(mode: str):
    before = settings.get_matmul_precision()
    settings.set_matmul_precision(MODES[mode][1])
    try:
        yield
    finally:
        settings.set_matmul_precision(before)


def rounded(a: np.ndarray, mode: str) -> np.ndarray:
    """a rounded to the mode's dtype, back in float64 (the values the kernels see)."""
    return a.astype(MODES[mode][0]).astype(np.float64)


def on_gpu(a: np.ndarray, mode: str):
    return cp.asarray(a.astype(MODES[mode][0]))


def kernel_precision(mode: str) -> int:
    return {"fp32": conv_plan.PREC_3XTF32, "tf32": conv_plan.PREC_TF32}.get(mode,
                                                                          conv_plan.PREC_16)


def assert_bounded(got, want: np.ndarray, magnitude: np.ndarray, terms: int, mode: str,
                   slope: float = 1.0, stored_magnitude: np.ndarray | None = None,
                   operand: float = 0.0) -> None:
    """|got - want| within the mode's bound (module docstring); ``magnitude`` is the
    float64 result on absolute values, ``slope`` the epilogue's amplification,
    ``stored_magnitude`` the values rounded to the dtype (default |want|) and
    ``operand`` a relative error of an operand the kernels compute (added to each
    product's)."""
    _, _, product, stored = MODES[mode]
    product += operand
    got = cp.asnumpy(got).astype(np.float64)
    assert got.shape == want.shape
    assert np.all(np.isfinite(got)), "non-finite output"
    stored_magnitude = np.abs(want) if stored_magnitude is None else stored_magnitude
    bound = 2 * (slope * (product + 2 * terms * 2.0**-24) * magnitude
                 + stored * stored_magnitude)
    bound += 2.0**-24 if mode == "fp16" else 1e-30
    excess = np.abs(got - want) / bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess.max() <= 1.0, (f"{mode}: error {abs(got - want)[worst]:.3g} at {worst} exceeds "
                                 f"bound {bound[worst]:.3g} (want {want[worst]:.6g})")


def ran_implicit_gemm(op: str) -> bool:
    counts = conv_plan.stats()
    return counts["implicit_gemm"].get(op, 0) > 0 and not counts["fallback"]


@st.composite
def geometries(draw):
    """Odd and tiny sizes, every kernel size up to 4, stride up to 3, padding, dilation."""
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - 2 * ph), 13))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - 2 * pw), 13))
    n, c, cout = draw(st.integers(1, 3)), draw(st.integers(1, 19)), draw(st.integers(1, 19))
    return (n, c, h, w), (cout, c, kh, kw), (sh, sw), (ph, pw), (dh, dw)


def conv_case(geometry, mode: str, channels_last: bool):
    """Inputs (rounded to the mode's dtype), their GPU copies (x optionally a
    non-contiguous channels-last view) and the float64 forward."""
    xs, ws, stride, padding, dilation = geometry
    x, w = rounded(RNG.standard_normal(xs), mode), rounded(RNG.standard_normal(ws), mode)
    gx = on_gpu(x.transpose(0, 2, 3, 1).copy(), mode).transpose(0, 3, 1, 2) if channels_last \
        else on_gpu(x, mode)
    return x, w, gx, on_gpu(w, mode), REF.conv2d(x, w, stride, padding, dilation, 1)


PASSES = ("forward", "input_grad", "weight_grad")


def check_passes(geometry, mode: str, channels_last: bool = False, passes=PASSES) -> None:
    """Run ``passes`` on the GPU and bound each against the float64 reference."""
    xs, ws, stride, padding, dilation = geometry
    geo = (stride, padding, dilation, 1)
    x, w, gx, gw, want = conv_case(geometry, mode, channels_last)
    g = rounded(RNG.standard_normal(want.shape), mode)
    cout, c, kh, kw = ws
    with precision(mode):
        if "forward" in passes:
            assert_bounded(GPU.conv2d(gx, gw, *geo), want, REF.conv2d(abs(x), abs(w), *geo),
                           c * kh * kw, mode)
        if "input_grad" in passes:
            assert_bounded(GPU.conv2d_grad_input(on_gpu(g, mode), gw, xs, *geo),
                           REF.conv2d_grad_input(g, w, xs, *geo),
                           REF.conv2d_grad_input(abs(g), abs(w), xs, *geo), cout * kh * kw, mode)
        if "weight_grad" in passes:
            assert_bounded(GPU.conv2d_grad_weight(on_gpu(g, mode), gx, ws, *geo),
                           REF.conv2d_grad_weight(g, x, ws, *geo),
                           REF.conv2d_grad_weight(abs(g), abs(x), ws, *geo), g[:, 0].size, mode)


@pytest.mark.parametrize("mode", MODES)
@given(geometry=geometries(), channels_last=st.booleans())
def test_forward_and_gradients_match_float64(mode, geometry, channels_last):
    conv_plan.reset_stats()
    check_passes(geometry, mode, channels_last)
    _, ws, stride, padding, dilation = geometry
    if ws[2:] == (1, 1) and (stride, padding, dilation) == ((1, 1), (0, 0), (1, 1)):
        assert not any(ran_implicit_gemm(op) for op in PASSES)  # a plain GEMM per image: cuBLAS
    else:
        assert all(ran_implicit_gemm(op) for op in PASSES)


@pytest.mark.parametrize("mode", MODES)
def test_pointwise_conv_reads_tokens_without_a_copy(mode, monkeypatch):
    """A 1x1 convolution of tokens seen as an image (a [B, H·W, C] array transposed to
    [B, C, H, W], as a transformer's output projection gets it) is one GEMM over the
    array as it lies: no contiguous copy, the float64 result."""
    geometry = ((2, 24, 5, 7), (40, 24, 1, 1), (1, 1), (0, 0), (1, 1))
    _, w, gx, gw, want = conv_case(geometry, mode, channels_last=True)
    x = cp.asnumpy(gx).astype(np.float64)

    def refused(a, *args, **kwargs):
        raise AssertionError("a pointwise convolution copied its channels-last input")

    monkeypatch.setattr(cp, "ascontiguousarray", refused)
    with precision(mode):
        got = GPU.conv2d(gx, gw, (1, 1), (0, 0), (1, 1), 1)
    assert_bounded(got, want, REF.conv2d(abs(x), abs(w), (1, 1), (0, 0), (1, 1), 1), 24, mode)


def every_plan(kernel: str):
    """(mode, plan) for every tile of the kernel, unsplit and split: each instantiation
    (the wgmma tiles too; they run only where the GPU has warpgroup MMA)."""
    for mode in MODES:
        kernels = {t.expression(kernel, "T", 0): t for wgmma in (False, True)
                   for t in conv_plan.tiles(kernel, kernel_precision(mode), wgmma)}
        for tile in kernels.values():
            for splits in (1, 3):
                yield pytest.param(mode, conv_plan.Plan(tile, splits),
                                   id=f"{mode}-{tile.bm}x{tile.bn}x{tile.bk}-w{tile.warps_m}"
                                      f"x{tile.warps_n}{'-wgmma' if tile.wgmma else ''}"
                                      f"-split{splits}")


def runs_here(tile: conv_plan.Tile) -> None:
    """Skip a wgmma tile on a GPU without warpgroup MMA."""
    if tile.wgmma and not loader.has_wgmma():
        pytest.skip("wgmma needs compute capability 9.0")


# channel counts that straddle K tiles (72 = 2 x 32 + 8), several M and N tiles, stride 2
PLAN_GEOMETRY = ((2, 72, 19, 17), (136, 72, 3, 3), (2, 2), (1, 1), (1, 1))


@pytest.mark.parametrize("mode, plan", list(every_plan(conv_plan.FPROP)))
def test_every_forward_tile(mode, plan):
    runs_here(plan.tile)
    with conv_plan.forced(conv_plan.FPROP, plan):
        check_passes(PLAN_GEOMETRY, mode, passes=("forward", "input_grad"))


# channels that fill whole K tiles (2 blocks of 64 16-bit values, 4 of 32 floats) and an
# output gradient of 64 channels: the forward and the strided input gradient walk K with
# the taps inside each channel block (activation copies through L1); the forward's rows
# of 8 pixels take the epilogue's four-pixel stores, the input gradient's phases not
TAPS_INNER_GEOMETRY = ((2, 128, 13, 16), (64, 128, 3, 3), (2, 2), (1, 1), (1, 1))


@pytest.mark.parametrize("mode, plan", list(every_plan(conv_plan.FPROP)))
@pytest.mark.parametrize("taps_inner", [True, False])
def test_forward_walks_taps_inside_channel_blocks(mode, plan, taps_inner):
    runs_here(plan.tile)
    plan = dataclasses.replace(plan, taps_inner=taps_inner)
    with conv_plan.forced(conv_plan.FPROP, plan):
        check_passes(TAPS_INNER_GEOMETRY, mode, passes=("forward", "input_grad"))
        assert conv_plan.last[conv_plan.FPROP] == plan


# the wgmma weight gradient's geometry (stride 1, rows of whole 16-byte chunks): tap
# boundaries inside column tiles (9 x 72 columns), two row tiles of output channels
WGMMA_WGRAD_GEOMETRY = ((2, 72, 16, 16), (136, 72, 3, 3), (1, 1), (1, 1), (1, 1))


@pytest.mark.parametrize("mode, plan", list(every_plan(conv_plan.WGRAD)))
def test_every_weight_grad_tile(mode, plan):
    runs_here(plan.tile)
    geometry = WGMMA_WGRAD_GEOMETRY if plan.tile.wgmma else PLAN_GEOMETRY
    with conv_plan.forced(conv_plan.WGRAD, plan):
        check_passes(geometry, mode, channels_last=True, passes=("weight_grad",))
        assert conv_plan.last[conv_plan.WGRAD] == plan


@pytest.mark.parametrize("mode", ["tf32", "bf16", "fp16"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("kernel", [conv_plan.FPROP, conv_plan.WGRAD])
@pytest.mark.parametrize("lookahead", ["stages - 1", "producer"])
@pytest.mark.parametrize("which", [0, 1, 2, 3, 4])
def test_wgmma_pipelines(mode, splits, kernel, lookahead, which):
    """The warpgroup-MMA main loops other than the default: stages - 1 tile copies ahead
    (each wgmma group waited for before the next tile), and the copies on a warpgroup of
    their own (lookahead 0, mbarriers per stage; every tile, 3 splits leaving some blocks
    fewer K tiles than stages) compute what the default one does."""
    if not loader.has_wgmma():
        pytest.skip("wgmma needs compute capability 9.0")
    tiles = conv_plan.tiles(kernel, kernel_precision(mode), True)
    if which >= len(tiles) or not tiles[which].wgmma or (lookahead == "stages - 1" and which > 0):
        pytest.skip("not a wgmma tile; one tile is enough for the lookahead")
    tile = tiles[which]
    ahead = tile.stages - 1 if lookahead == "stages - 1" else 0
    plan = conv_plan.Plan(dataclasses.replace(tile, lookahead=ahead), splits)
    forward = kernel == conv_plan.FPROP
    with conv_plan.forced(kernel, plan):
        check_passes(PLAN_GEOMETRY if forward else WGMMA_WGRAD_GEOMETRY, mode, channels_last=not forward,
                     passes=("forward", "input_grad") if forward else ("weight_grad",))
        assert conv_plan.last[kernel] == plan


@pytest.mark.parametrize("mode", ["tf32", "bf16", "fp16"])
@pytest.mark.parametrize("geometry", [
    ((1, 5, 8, 8), (3, 5, 3, 3), (1, 1), (1, 1), (1, 1)),        # tiny channel counts
    ((3, 19, 9, 15), (70, 19, 2, 4), (1, 1), (0, 2), (1, 1)),    # non-square kernel, padding
    ((2, 40, 12, 8), (24, 40, 1, 1), (1, 1), (2, 0), (1, 1)),    # 1x1 with padding
    ((1, 130, 14, 8), (260, 130, 3, 3), (1, 1), (2, 1), (1, 1)),  # several row and column tiles
])
@pytest.mark.parametrize("channels_last", [False, True])
def test_weight_grad_on_warpgroup_mma(mode, geometry, channels_last):
    """The wgmma weight gradient (stride 1, dilation 1, output rows of whole 16-byte chunks
    and planes of whole 128-byte K tiles) against float64, input read through strides."""
    if not loader.has_wgmma():
        pytest.skip("wgmma needs compute capability 9.0")
    check_passes(geometry, mode, channels_last, passes=("weight_grad",))
    assert conv_plan.last[conv_plan.WGRAD].tile.wgmma


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("act", ["none", "relu", "gelu", "silu"])
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("images, cout, width", [(2, 40, 9), (1, 5, 9), (2, 40, 12)])
@pytest.mark.parametrize("wgmma", [False, True])
def test_fused_epilogue(mode, act, splits, images, cout, width, wgmma):
    """bias + activation + residual * scale, fused in the GEMM's epilogue (splits=1) or in
    the split-K reduce kernel (four outputs per thread; 1 x 5 x 10 x 9 = 450 outputs are
    not a whole number of fours, so the reduce's one-per-thread path runs too).  Rows of
    12 pixels take the epilogue's four-pixel stores, rows of 9 its one-pixel stores."""
    geometry = ((images, 24, 10, width), (cout, 24, 3, 3), (1, 1), (1, 1), (1, 1))
    geo = geometry[2:] + (1,)
    x, w, gx, gw, conv = conv_case(geometry, mode, False)
    bias = rounded(RNG.standard_normal(cout), mode)
    residual = rounded(RNG.standard_normal(conv.shape), mode)
    want = REF.conv2d(x, w, *geo, bias=bias, act=act, residual=residual, residual_scale=0.7)
    tile = conv_plan.tiles(conv_plan.FPROP, kernel_precision(mode), wgmma)[1]
    runs_here(tile)
    strided_bias = on_gpu(np.repeat(bias, 2), mode)[::2]  # a view: read through its stride
    with precision(mode), conv_plan.forced(conv_plan.FPROP, conv_plan.Plan(tile, splits)):
        y = GPU.conv2d(gx, gw, *geo, bias=strided_bias, act=act,
                       residual=on_gpu(residual, mode), residual_scale=0.7)
    magnitude = 0.7 * (REF.conv2d(abs(x), abs(w), *geo) + abs(bias)[None, :, None, None]
                       + abs(residual))
    assert_bounded(y, want, magnitude, 24 * 9 + 2, mode, slope=ACT_SLOPE)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("geometry, padding", [
    (((1, 128, 37, 70), (3, 128, 3, 3)), (1, 1)),   # two channel blocks, partial tiles both ways
    (((2, 5, 9, 16), (8, 5, 3, 3)), (1, 1)),        # a few channels, zero-filled in the block
    (((1, 72, 11, 40), (1, 72, 1, 1)), (1, 0)),     # 1 x 1 with padding (unpadded: cuBLAS), a partial channel block
    (((2, 24, 12, 33), (4, 24, 5, 3)), (2, 0)),     # non-square kernel, padding on one axis
    (((1, 200, 6, 6), (7, 200, 3, 3)), (0, 0)),     # output smaller than the input
])
def test_few_output_channels_read_the_input_once(mode, geometry, padding, monkeypatch):
    """A forward to at most 8 channels (stride 1) runs the halo kernel, fused epilogue
    included, against float64; 3xTF32 (fp32 at "highest") keeps the GEMM."""
    launches = []
    launch = conv_halo.launch
    monkeypatch.setattr(conv_halo, "launch", lambda *args: (launches.append(1), launch(*args)))
    xs, ws = geometry
    geo = ((1, 1), padding, (1, 1), 1)
    x, w, gx, gw, want = conv_case((xs, ws, *geo[:3]), mode, False)
    bias = rounded(RNG.standard_normal(ws[0]), mode)
    residual = rounded(RNG.standard_normal(want.shape), mode)
    with precision(mode):
        y = GPU.conv2d(gx, gw, *geo, bias=on_gpu(bias, mode), act="silu", residual=on_gpu(residual, mode),
                       residual_scale=0.7)
    want = REF.conv2d(x, w, *geo, bias=bias, act="silu", residual=residual, residual_scale=0.7)
    magnitude = 0.7 * (REF.conv2d(abs(x), abs(w), *geo) + abs(bias)[None, :, None, None] + abs(residual))
    assert_bounded(y, want, magnitude, ws[1] * ws[2] * ws[3] + 2, mode, slope=ACT_SLOPE)
    assert len(launches) == (0 if mode == "fp32" else 1)


@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16"])
def test_autograd_conv_and_transposed_conv(mode):
    """Conv2d and ConvTranspose2d through autograd on the GPU: every gradient matches the
    float64 kernels of the NumPy backend."""
    dtype = MODES[mode][0]
    x = rounded(RNG.standard_normal((2, 12, 11, 10)), mode)
    w = rounded(RNG.standard_normal((20, 12, 3, 3)), mode)
    wt = rounded(RNG.standard_normal((12, 20, 3, 3)), mode)
    b = rounded(RNG.standard_normal(20), mode)
    geo = ((2, 2), (1, 1), (1, 1), 1)
    with precision(mode):
        tx, tw, twt, tb = (tc.tensor(a.astype(dtype), device="cuda", requires_grad=True)
                           for a in (x, w, wt, b))
        y = tc.functional.conv2d(tx, tw, tb, stride=2, padding=1)
        z = tc.functional.conv_transpose2d(tx, twt, stride=2, padding=1, output_padding=1)
        gy = rounded(RNG.standard_normal(y.shape), mode)
        gz = rounded(RNG.standard_normal(z.shape), mode)
        loss = (y * tc.tensor(gy.astype(dtype), device="cuda")).sum() + \
            (z * tc.tensor(gz.astype(dtype), device="cuda")).sum()
        loss.backward()
    want_y = REF.conv2d(x, w, *geo, bias=b)
    assert_bounded(y.data, want_y, REF.conv2d(abs(x), abs(w), *geo) + abs(b)[None, :, None, None],
                   12 * 9 + 1, mode)
    want_z = REF.conv2d_grad_input(x, wt, z.shape, *geo)
    assert_bounded(z.data, want_z, REF.conv2d_grad_input(abs(x), abs(wt), z.shape, *geo),
                   12 * 9, mode)
    dx_y, dx_z = REF.conv2d_grad_input(gy, w, x.shape, *geo), REF.conv2d(gz, wt, *geo)
    dx_mag = REF.conv2d_grad_input(abs(gy), abs(w), x.shape, *geo) + REF.conv2d(abs(gz), abs(wt), *geo)
    # the two gradients are each rounded to the dtype, then summed and rounded again
    assert_bounded(tx.grad.data, dx_y + dx_z, dx_mag, 20 * 9, mode,
                   stored_magnitude=abs(dx_y) + abs(dx_z) + abs(dx_y + dx_z))
    assert_bounded(tw.grad.data, REF.conv2d_grad_weight(gy, x, w.shape, *geo),
                   REF.conv2d_grad_weight(abs(gy), abs(x), w.shape, *geo), gy[:, 0].size, mode)
    assert_bounded(twt.grad.data, REF.conv2d_grad_weight(x, gz, wt.shape, *geo),
                   REF.conv2d_grad_weight(abs(x), abs(gz), wt.shape, *geo), x[:, 0].size, mode)
    assert_bounded(tb.grad.data, gy.sum(axis=(0, 2, 3)), abs(gy).sum(axis=(0, 2, 3)),
                   gy[:, 0].size, mode)


def test_captured_graph_replays_like_eager():
    """Forward with epilogue (split K), strided input gradient and split weight gradient,
    captured once and replayed on new inputs, equal the eager calls bit for bit."""
    xs, ws = (2, 64, 16, 16), (96, 64, 3, 3)
    geo = ((2, 2), (1, 1), (1, 1), 1)
    x = cp.asarray(RNG.standard_normal(xs).astype(np.float32))
    w = cp.asarray(RNG.standard_normal(ws).astype(np.float32))
    bias = cp.asarray(RNG.standard_normal(96).astype(np.float32))
    g = cp.asarray(RNG.standard_normal((2, 96, 8, 8)).astype(np.float32))
    residual = cp.asarray(RNG.standard_normal((2, 96, 8, 8)).astype(np.float32))
    tile = conv_plan.tiles(conv_plan.FPROP, conv_plan.PREC_TF32, loader.has_wgmma())[0]
    wtile = conv_plan.tiles(conv_plan.WGRAD, conv_plan.PREC_TF32)[0]

    def step():
        y = GPU.conv2d(x, w, *geo, bias=bias, act="silu", residual=residual, residual_scale=0.5)
        return y, GPU.conv2d_grad_input(g, w, xs, *geo), GPU.conv2d_grad_weight(g, x, ws, *geo)

    stream = cp.cuda.Stream(non_blocking=True)
    with precision("tf32"), conv_plan.forced(conv_plan.FPROP, conv_plan.Plan(tile, 3)), \
            conv_plan.forced(conv_plan.WGRAD, conv_plan.Plan(wtile, 5)), stream:
        step()  # warm: compile, size the scratch buffer
        stream.synchronize()
        stream.begin_capture()
        captured = step()
        graph = stream.end_capture()
        for _ in range(2):
            for a in (x, w, g, residual):
                a[...] = cp.asarray(RNG.standard_normal(a.shape).astype(np.float32))
            graph.launch(stream)
            eager = step()
            stream.synchronize()
            for got, want in zip(captured, eager):
                assert cp.array_equal(got, want)


def test_uncovered_calls_fall_back_visibly():
    """groups > 1 and float64 run the im2col + GEMM path, counted in tc.cuda.conv_stats."""
    x, w = RNG.standard_normal((2, 4, 7, 7)), RNG.standard_normal((6, 2, 3, 3))
    geo = ((1, 1), (1, 1), (1, 1), 2)
    tc.cuda.reset_conv_stats()
    y = GPU.conv2d(cp.asarray(x.astype(np.float32)), cp.asarray(w.astype(np.float32)), *geo)
    np.testing.assert_allclose(cp.asnumpy(y), REF.conv2d(x, w, *geo), rtol=1e-4, atol=1e-4)
    assert tc.cuda.conv_stats()["fallback"] == {"forward: groups > 1": 1}
    x1, w1 = cp.asarray(x), cp.asarray(RNG.standard_normal((6, 4, 3, 3)))
    GPU.conv2d_grad_weight(GPU.conv2d(x1, w1, (1, 1), (1, 1), (1, 1), 1), x1, w1.shape,
                           (1, 1), (1, 1), (1, 1), 1)
    stats = tc.cuda.conv_stats()
    assert stats["fallback"]["forward: dtype float64"] == 1
    assert stats["fallback"]["weight_grad: dtype float64"] == 1
    assert stats["implicit_gemm"] == {}
    tc.cuda.reset_conv_stats()
    assert tc.cuda.conv_stats() == {"implicit_gemm": {}, "fallback": {}}
