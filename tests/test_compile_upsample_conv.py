"""The upsample-into-conv pass (passes/fuse_upsample_conv.py) and the backend op it
targets, ``upsample_conv2d``: the rewrite fires where the convolution is the upsampling's
one reader, leaves every other graph alone, and compiled == eager on every backend.  On
the GPU a 2x upsampling into a 3x3 convolution runs as one stride-2 transposed
convolution of the small image (cupy/conv_igemm.upsample_forward), bounded here against
float64: the convolution's bound (test_cuda_conv.py) over 4 taps per output phase, with
the summed phase weights' one rounding added to each product's error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import layers
import tensorcore as tc
import tensorcore.functional as F
from diffusion.models.sampling import Upsample2D
from tensorcore.compile.passes import DEFAULT, PASSES
from tensorcore.compile.passes.fuse_epilogue import fuse_epilogue
from tensorcore.compile.passes.fuse_upsample_conv import fuse_upsample_conv
from test_compile_fusion import assert_matches, check_compiled, conv_params, traced, train_step
from test_compile_graph import ops
from test_compile_passes import compiled_twice, replays_without


def fused(fn, *args):
    """The graph of ``fn`` after epilogue fusion, then this pass."""
    return fuse_upsample_conv(fuse_epilogue(traced(fn, *args)))


class UpConv(layers.Module):
    """Upsample2D, then a residual add: the conv's epilogue comes along."""

    def __init__(self, channels: int = 4, out_channels: int = 5) -> None:
        super().__init__()
        self.up = Upsample2D(channels, out_channels=out_channels)

    def forward(self, x: tc.Tensor, r: tc.Tensor) -> tc.Tensor:
        return self.up(x) + r


def test_the_pass_runs_after_norm_conv_fusion_and_before_elementwise_fusion():
    assert PASSES["fuse_upsample_conv"] is fuse_upsample_conv
    assert DEFAULT.index("fuse_norm_conv") < DEFAULT.index("fuse_upsample_conv") \
        < DEFAULT.index("fuse_elementwise") < DEFAULT.index("place_concat")


def test_an_upsampled_conv_input_becomes_one_call(backend):
    tc.manual_seed(0)
    block = UpConv().eval()
    x, r = tc.randn(2, 4, 3, 5), tc.randn(2, 5, 6, 10)
    graph = fused(block, x, r)
    assert ops(graph) == ["upsample_conv2d"] and graph.stats["fuse_upsample_conv"] == 1
    node = graph.nodes[0]
    assert tuple(node.args[1]) == (6, 10) and graph.values[node.args[0].value].shape == (2, 4, 3, 5)
    assert set(node.kwargs) == {"bias", "residual"}  # the conv's epilogue stays with it
    with tc.no_grad():
        assert check_compiled(block, x, r, backend=backend)["fuse_upsample_conv"] == 1


@pytest.mark.parametrize("size", [None, (7, 9)])
def test_any_nearest_size_and_conv_geometry_fold(backend, size):
    w, b = conv_params(3, 4, 3)
    x = tc.randn(1, 3, 4, 5)
    fn = lambda x: F.conv2d(F.interpolate(x, size=size, scale_factor=None if size else 2, mode="nearest"),  # noqa: E731
                            w, b, stride=2, padding=1)
    assert ops(fused(fn, x)) == ["upsample_conv2d"]
    with tc.no_grad():
        check_compiled(fn, x, backend=backend)


def test_the_pass_leaves_what_it_must(backend):
    w, b = conv_params(4, 4)
    x = tc.randn(1, 4, 5, 5)
    up = lambda x: F.interpolate(x, scale_factor=2, mode="nearest")  # noqa: E731
    conv = lambda y: F.conv2d(y, w, b, padding=1)  # noqa: E731
    cases = {
        "upsampled result returned": lambda x: (lambda y: (conv(y), y))(up(x)),
        "read by two convs": lambda x: (lambda y: conv(y) + conv(y))(up(x)),
        "read by another call too": lambda x: (lambda y: conv(y) + y)(up(x)),
        "its own residual": lambda x: (lambda y: F.conv2d(y, w, b, padding=1) + y)(up(x)),
        "upsampled tensor is the weight": lambda x: F.conv2d(x, up(w), padding=1),
        "a view between": lambda x: conv(up(x)[:, :, 1:]),
        "bilinear": lambda x: conv(F.interpolate(x, scale_factor=2, mode="bilinear")),
    }
    for name, fn in cases.items():
        graph = fuse_epilogue(traced(fn, x))
        assert "upsample_conv2d" not in ops(fuse_upsample_conv(graph)), name
        with tc.no_grad():
            check_compiled(fn, x, backend=backend)


def test_the_pass_stays_out_of_training_graphs(backend):
    """The weight gradient reads the upsampled tensor."""
    block = UpConv()
    x, r = tc.randn(1, 4, 3, 3), tc.randn(1, 5, 6, 6)
    step = train_step(lambda x, r: block(x, r).sum(), block)
    assert "upsample_conv2d" not in ops(fused(step, x, r))
    replays_without("fuse_upsample_conv", step, x, r, atol=1e-5)


def test_switched_off_the_upsampling_and_conv_stay_apart(backend):
    block = UpConv().eval()
    x, r = tc.randn(1, 4, 3, 3), tc.randn(1, 5, 6, 6)
    with tc.no_grad():
        compiled, got = compiled_twice(block, x, r, passes={"fuse_upsample_conv": False})
        want = block(x, r)
    table = compiled.plan_info()[0]["graph"]
    assert "upsample_conv2d(" not in table and "upsample_nearest2d(" in table
    assert_matches(got, want, backend)


@pytest.mark.parametrize("backend_name", ["numpy", "numba"])
def test_the_op_is_the_two_calls_it_stands_for(backend_name):
    with tc.use_backend(backend_name):
        be = tc.get_backend()
        rng = np.random.default_rng(3)
        arr = lambda *shape: be.from_numpy(rng.standard_normal(shape).astype(np.float32))  # noqa: E731
        x, w, b, r = arr(2, 6, 5, 4), arr(3, 6, 3, 3), arr(3), arr(2, 3, 10, 8)
        out = be.from_numpy(np.zeros((2, 3, 10, 8), np.float32))
        got = be.upsample_conv2d(x, (10, 8), w, (1, 1), (1, 1), (1, 1), 1, bias=b, act="silu", residual=r,
                                 residual_scale=0.5, out=out)
        want = be.conv2d(be.upsample_nearest2d(x, (10, 8)), w, (1, 1), (1, 1), (1, 1), 1, b, "silu", r, 0.5)
        assert got is out
        np.testing.assert_array_equal(be.to_numpy(got), be.to_numpy(want))


def test_the_op_checks_its_arguments_before_any_work(backend):
    be = tc.get_backend()
    x, w = be.from_numpy(np.ones((1, 4, 3, 3), np.float32)), be.from_numpy(np.ones((2, 4, 3, 3), np.float32))
    geometry = ((1, 1), (1, 1), (1, 1), 1)
    with pytest.raises(ValueError, match="upsample_conv2d: output size must be two positive ints"):
        be.upsample_conv2d(x, (0, 6), w, *geometry)
    with pytest.raises(ValueError, match="upsample_conv2d: expected \\[N, C, H, W\\]"):
        be.upsample_conv2d(x[0], (6, 6), w, *geometry)
    with pytest.raises(ValueError, match="upsample_conv2d: x with 4 channels"):
        be.upsample_conv2d(x, (6, 6), w[:, :3], *geometry)
    with pytest.raises(ValueError, match="upsample_conv2d: out must be a C-contiguous float32 array of shape "
                                         "\\(1, 2, 6, 6\\)"):
        be.upsample_conv2d(x, (6, 6), w, *geometry, out=be.from_numpy(np.ones((1, 2, 3, 3), np.float32)))
    with pytest.raises(ValueError, match="upsample_conv2d"):
        be.upsample_conv2d(x, (6, 6), w, *geometry, residual=be.from_numpy(np.ones((1, 2, 3, 3), np.float32)))


# ----- the GPU's transposed convolution ------------------------------------------------------
@st.composite
def gpu_cases(draw):
    return dict(n=draw(st.integers(1, 2)), c=draw(st.sampled_from([1, 3, 8, 16, 40])),
                cout=draw(st.integers(1, 70)), h=draw(st.integers(1, 9)), w=draw(st.integers(1, 13)),
                act=draw(st.sampled_from(["none", "silu", "gelu"])), bias=draw(st.booleans()),
                residual=draw(st.booleans()), scale=draw(st.sampled_from([1.0, 0.5])),
                channels_last=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16", "fp16"])
@given(case=gpu_cases())
def test_the_gpu_op_matches_float64(mode, case):
    cp = pytest.importorskip("cupy")
    from tensorcore.backends.cupy import conv_plan
    from tensorcore.backends.cupy.backend import CupyBackend
    from tensorcore.backends.numpy.backend import NumpyBackend
    from test_cuda_conv import ACT_SLOPE, MODES, assert_bounded, on_gpu, precision, ran_implicit_gemm, rounded

    gpu, ref = CupyBackend(), NumpyBackend()
    rng = np.random.default_rng(case["seed"])
    n, c, cout, h, wd = (case[k] for k in ("n", "c", "cout", "h", "w"))
    x = rounded(rng.standard_normal((n, c, h, wd)), mode)
    w = rounded(rng.standard_normal((cout, c, 3, 3)), mode)
    bias = rounded(rng.standard_normal(cout), mode) if case["bias"] else None
    residual = rounded(rng.standard_normal((n, cout, 2 * h, 2 * wd)), mode) if case["residual"] else None
    geometry = ((1, 1), (1, 1), (1, 1), 1)
    up = ref.upsample_nearest2d(x, (2 * h, 2 * wd))
    conv = ref.conv2d(up, w, *geometry) + (0 if bias is None else bias[None, :, None, None])
    act = case["act"]
    want = (ref.unary(act, conv) if act != "none" else conv) + (0 if residual is None else residual)
    want = want * case["scale"]
    magnitude = ref.conv2d(np.abs(up), np.abs(w), *geometry)
    magnitude += 0 if bias is None else np.abs(bias)[None, :, None, None]
    gw = on_gpu(w, mode)
    if case["channels_last"]:  # how a compiled plan stores conv weights
        gw = cp.ascontiguousarray(gw.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    args = dict(bias=None if bias is None else on_gpu(bias, mode),
                residual=None if residual is None else on_gpu(residual, mode),
                act=act, residual_scale=case["scale"])
    conv_plan.reset_stats()
    with precision(mode):
        got = gpu.upsample_conv2d(on_gpu(x, mode), (2 * h, 2 * wd), gw, *geometry, **args)
    assert ran_implicit_gemm("upsample_forward")
    # the phase weights are sums of up to four taps, rounded once to what the GEMM reads
    operand = {"fp32": 4 * 2.0**-24, "tf32": 0.0}.get(mode, MODES[mode][3])
    assert_bounded(got, want, magnitude * case["scale"], 4 * c, mode, ACT_SLOPE if act != "none" else 1.0,
                   stored_magnitude=np.abs(want), operand=operand)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_gpu_op_writes_into_a_concatenations_slice(dtype):
    cp = pytest.importorskip("cupy")
    from tensorcore.backends.cupy.backend import CupyBackend

    gpu = CupyBackend()
    rng = np.random.default_rng(1)
    kind = tc.bfloat16 if dtype == "bfloat16" else dtype
    x, w, b = (cp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(kind)
               for shape in ((1, 16, 8, 8), (24, 16, 3, 3), (24,)))
    geometry = ((1, 1), (1, 1), (1, 1), 1)
    whole = cp.full((1, 32, 16, 16), 7, dtype=x.dtype)
    got = gpu.upsample_conv2d(x, (16, 16), w, *geometry, bias=b, out=whole[:, :24])
    assert got.data.ptr == whole.data.ptr
    want = gpu.upsample_conv2d(x, (16, 16), w, *geometry, bias=b)
    assert cp.array_equal(whole[:, :24], want) and bool((whole[:, 24:].astype(cp.float32) == 7).all())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [tc.float32, tc.float16])
@pytest.mark.parametrize("latent, folded", [(32, True), (8, False)])
def test_a_compiled_vae_decoder_matches_eager_and_refreshes_its_phase_weights(dtype, latent, folded):
    """The plan keeps the upsampler's 4x4 phase weights (64 x 16 x 64 values) where the
    upsampled image they spare is larger (64 x 64² at 32² latents); at 8² latents it runs
    the upsampling and the convolution instead, and holds no such copy."""
    from diffusion.models.vae import Decoder
    from tensorcore.backends.cupy import conv_plan

    tc.manual_seed(0)
    decoder = Decoder(4, 3, ("UpDecoderBlock2D",) * 2, block_out_channels=(32, 64), layers_per_block=1,
                      norm_num_groups=8, act_fn="silu").to("cuda").to(dtype=dtype).eval()
    z = tc.randn(1, 4, latent, latent).to("cuda").to(dtype=dtype)
    compiled = tc.compile(decoder)
    with tc.no_grad():
        conv_plan.reset_stats()
        got = compiled(z).float().numpy()
        assert (conv_plan.stats()["implicit_gemm"].get("upsample_forward", 0) > 0) == folded
        want = decoder(z).float().numpy()
        assert compiled.plan_info()[0]["passes"]["fuse_upsample_conv"] == 1
        bound = (2e-5 if dtype == tc.float32 else 1e-2) * np.abs(want).max()
        assert np.abs(got - want).max() <= bound
        conv = next(m for m in decoder.modules() if isinstance(m, Upsample2D)).conv
        conv.weight.mul_(-2.0)  # a write into the weight's memory: the kept phase weights follow
        got, want = compiled(z).float().numpy(), decoder(z).float().numpy()
        assert np.abs(got - want).max() <= 2 * bound
