"""The norm-into-conv pass (passes/fuse_norm_conv.py) and the backend op it targets,
``group_norm_conv2d``, on every backend: the rewrite fires where the convolution is the
GroupNorm's one reader, leaves every other graph alone, and compiled == eager.  The CUDA
kernels behind the op have their own bounds in test_cuda_norm_conv.py."""

from __future__ import annotations

import numpy as np
import pytest

import layers
import tensorcore as tc
import tensorcore.functional as F
from diffusion.models.resnet import ResnetBlock2D
from tensorcore.compile.passes import DEFAULT, PASSES
from tensorcore.compile.passes.fuse_norm import fuse_norm
from tensorcore.compile.passes.fuse_epilogue import fuse_epilogue
from tensorcore.compile.passes.fuse_norm_conv import fuse_norm_conv
from test_compile_fusion import assert_matches, check_compiled, conv_params, traced, train_step
from test_compile_graph import ops
from test_compile_passes import compiled_twice, replays_without


def fused(fn, *args):
    """The graph of ``fn`` through the passes before this one, then this one."""
    return fuse_norm_conv(fuse_norm(fuse_epilogue(traced(fn, *args))))


class NormConv(layers.Module):
    """GroupNorm (+ time-embedding shift) -> SiLU -> 3x3 conv + residual: half a ResBlock."""

    def __init__(self, channels: int = 4, groups: int = 2) -> None:
        super().__init__()
        self.norm = layers.GroupNorm(groups, channels)
        self.conv = layers.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: tc.Tensor, emb: tc.Tensor) -> tc.Tensor:
        return self.conv(F.silu(self.norm(x + emb[:, :, None, None]))) + x


def test_the_pass_runs_after_norm_fusion_and_before_elementwise_fusion():
    assert PASSES["fuse_norm_conv"] is fuse_norm_conv
    assert DEFAULT.index("fuse_epilogue") < DEFAULT.index("fuse_norm") < DEFAULT.index("fuse_norm_conv") \
        < DEFAULT.index("fuse_elementwise")


def test_a_normalized_conv_input_becomes_one_call(backend):
    tc.manual_seed(0)
    block = NormConv().eval()
    x, emb = tc.randn(2, 4, 5, 5), tc.randn(2, 4)
    graph = fused(block, x, emb)
    assert ops(graph) == ["group_norm_conv2d"] and graph.stats["fuse_norm_conv"] == 1
    node = graph.nodes[0]
    weight, bias, groups, eps, act, shift = node.args[1]
    assert (groups, eps, act) == (2, block.norm.eps, "silu")
    assert graph.values[shift.value].shape == (2, 4)
    assert set(node.kwargs) == {"bias", "residual"}  # the conv's epilogue stays with it
    with tc.no_grad():
        assert check_compiled(block, x, emb, backend=backend)["fuse_norm_conv"] == 1


@pytest.mark.parametrize("act", ["none", "silu", "gelu"])
def test_a_plain_group_norm_folds_with_its_activation(backend, act):
    gn = layers.GroupNorm(3, 6)
    w, b = conv_params(6, 5, 3)
    x = tc.randn(1, 6, 4, 7)
    fn = lambda x: F.conv2d(F.group_norm(x, 3, gn.weight, gn.bias, act=act), w, b, stride=2, padding=1)  # noqa: E731
    graph = fused(fn, x)
    assert ops(graph) == ["group_norm_conv2d"] and graph.nodes[0].args[1][4] == act
    with tc.no_grad():
        check_compiled(fn, x, backend=backend)


def test_the_pass_leaves_what_it_must(backend):
    gn = layers.GroupNorm(2, 4)
    w, b = conv_params(4, 4)
    x = tc.randn(1, 4, 4, 4)
    conv = lambda y: F.conv2d(y, w, b, padding=1)  # noqa: E731

    def stats_read(x):
        y, mean, rstd = tc.get_backend().group_norm(x.data, gn.weight.data, gn.bias.data, 2, 1e-5)
        return conv(tc.Tensor._wrap(y, x.device)) + tc.Tensor._wrap(mean, x.device).sum()

    cases = {
        "normalized result returned": lambda x: (lambda y: (conv(y), y))(gn(x)),
        "read by two convs": lambda x: (lambda y: conv(y) + conv(y))(gn(x)),
        "read by another call too": lambda x: (lambda y: conv(y) + y)(gn(x)),
        "normalized tensor is the weight": lambda x: F.conv2d(x, gn(w), padding=1),
        "a view between": lambda x: conv(gn(x)[:, :, 1:]),
        "no norm": lambda x: conv(F.silu(x)),
    }
    for name, fn in cases.items():
        graph = fuse_norm(fuse_epilogue(traced(fn, x)))
        assert ops(fuse_norm_conv(graph)) == ops(graph), name
        with tc.no_grad():
            check_compiled(fn, x, backend=backend)
    with tc.no_grad():
        graph = fuse_norm(fuse_epilogue(traced(stats_read, x)))
    assert "group_norm" in ops(graph) and ops(fuse_norm_conv(graph)) == ops(graph)


def test_the_pass_stays_out_of_training_graphs(backend):
    """The backward reads the statistics and the normalized tensor."""
    block = NormConv()
    x, emb = tc.randn(2, 4, 4, 4), tc.randn(2, 4)
    step = train_step(lambda x, emb: block(x, emb).sum(), block)
    graph = fused(step, x, emb)
    assert "group_norm_conv2d" not in ops(graph) and "group_norm_backward" in ops(graph)
    replays_without("fuse_norm_conv", step, x, emb, atol=1e-6)


def test_switched_off_the_norm_and_conv_stay_apart(backend):
    block = NormConv().eval()
    x, emb = tc.randn(1, 4, 4, 4), tc.randn(1, 4)
    with tc.no_grad():
        compiled, got = compiled_twice(block, x, emb, passes={"fuse_norm_conv": False})
        want = block(x, emb)
    table = compiled.plan_info()[0]["graph"]
    assert "group_norm_conv2d(" not in table and "group_norm(" in table
    assert "fuse_norm_conv" not in compiled.plan_info()[0]["passes"]
    assert_matches(got, want, backend)


@pytest.mark.parametrize("in_channels, out_channels", [(4, 4), (4, 8)])
def test_a_resnet_block_folds_both_norms(backend, in_channels, out_channels):
    tc.manual_seed(1)
    block = ResnetBlock2D(in_channels, out_channels, temb_channels=6, groups=2).eval()
    x, temb = tc.randn(2, in_channels, 5, 5), tc.randn(2, 6)
    with tc.no_grad():
        compiled, got = compiled_twice(block, x, temb)
        want = block(x, temb)
    assert compiled.plan_info()[0]["passes"]["fuse_norm_conv"] == 2
    assert_matches(got, want, backend)


def test_the_op_is_the_two_calls_it_stands_for(backend):
    be = tc.get_backend()
    rng = np.random.default_rng(3)
    arr = lambda *shape: be.from_numpy(rng.standard_normal(shape).astype(np.float32))  # noqa: E731
    x, w, b = arr(2, 6, 5, 4), arr(3, 6, 3, 3), arr(3)
    norm = (arr(6), arr(6), 3, 1e-5, "silu", arr(2, 6))
    got = be.group_norm_conv2d(x, norm, w, (1, 1), (1, 1), (1, 1), 1, bias=b, act="relu")
    want = be.conv2d(be.group_norm(x, *norm)[0], w, (1, 1), (1, 1), (1, 1), 1, b, "relu")
    np.testing.assert_array_equal(be.to_numpy(got), be.to_numpy(want))  # on the GPU too: see conv_norm


def test_the_op_checks_its_arguments(backend):
    be = tc.get_backend()
    x, w = be.from_numpy(np.ones((1, 4, 4, 4), np.float32)), be.from_numpy(np.ones((2, 4, 3, 3), np.float32))
    geometry = ((1, 1), (1, 1), (1, 1), 1)
    with pytest.raises(TypeError, match="group_norm_conv2d: norm must be"):
        be.group_norm_conv2d(x, (None, None, 2), w, *geometry)
    with pytest.raises(ValueError, match="group_norm: .* cannot be split into 3 channel groups"):
        be.group_norm_conv2d(x, (None, None, 3, 1e-5, "none", None), w, *geometry)
    with pytest.raises(ValueError, match="activation"):
        be.group_norm_conv2d(x, (None, None, 2, 1e-5, "swish", None), w, *geometry)
    with pytest.raises(ValueError, match="group_norm: weight has shape"):
        be.group_norm_conv2d(x, (be.from_numpy(np.ones(3, np.float32)), None, 2, 1e-5, "none", None), w, *geometry)
    with pytest.raises(ValueError, match="x with 4 channels"):
        be.group_norm_conv2d(x, (None, None, 2, 1e-5, "none", None), w[:, :3], *geometry)
