"""The concatenation-placement pass (passes/place_concat.py) and the ``out=`` of the
convolutions it relies on, on every backend: parts made by convolutions are written
straight into their ranges of the concatenation, every graph it must not touch stays as
it was, and compiled == eager (bit for bit: only where values live changes)."""

from __future__ import annotations

import numpy as np
import pytest

import diffusion
import layers
import tensorcore as tc
import tensorcore.functional as F
from tensorcore.compile.passes import DEFAULT, PASSES
from tensorcore.compile.passes.place_concat import place_concat
from test_compile_fusion import compiled_unet, conv_params, traced
from test_compile_graph import ops
from test_compile_passes import compiled_twice


class SkipJoin(layers.Module):
    """A down conv whose result is read on, an up conv, their channel concatenation read
    by a third conv: a UNet's skip connection in small."""

    def __init__(self, channels: int = 4) -> None:
        super().__init__()
        self.down = layers.Conv2d(channels, channels, 3, padding=1)
        self.mid = layers.Conv2d(channels, channels + 2, 3, padding=1)
        self.up = layers.Conv2d(2 * channels + 2, channels, 1)

    def forward(self, x: tc.Tensor) -> tc.Tensor:
        skip = self.down(x)
        h = self.mid(F.silu(skip))
        return self.up(tc.cat([h, skip], axis=1))


def test_the_pass_runs_last():
    assert PASSES["place_concat"] is place_concat and DEFAULT[-1] == "place_concat"


def test_parts_are_written_in_place(backend):
    tc.manual_seed(0)
    block = SkipJoin().eval()
    x = tc.randn(1, 4, 5, 6)
    graph = place_concat(traced(block, x))
    assert "concatenate" not in ops(graph) and graph.stats["place_concat"] == 1
    (empty,) = [n for n in graph.nodes if n.op == "empty"]
    joined = graph.values[empty.out.value]
    assert empty.args == (joined.shape, joined.dtype) and graph.storages[joined.storage].written
    producers = [n for n in graph.nodes if "out" in n.kwargs]
    assert [n.op for n in producers] == ["conv2d", "conv2d"]
    offsets = sorted(graph.values[n.out.value].offset for n in producers)
    assert offsets == [0, 6 * 5 * 6 * 4]  # h, then skip after h's 6 channels
    assert all(n.writes == (joined.storage,) for n in producers)
    assert ops(graph).index("empty") < ops(graph).index("conv2d")
    with tc.no_grad():
        compiled, got = compiled_twice(block, x)
        np.testing.assert_array_equal(got.numpy(), block(x).numpy())
        assert compiled.plan_info()[0]["passes"]["place_concat"] == 1


def test_a_unet_at_batch_one_concatenates_nothing(backend):
    tc.manual_seed(0)  # the reference UNet's layout in small: no attention in the levels
    model = diffusion.UNet2D(sample_size=16, in_channels=3, out_channels=3, block_out_channels=(32, 64),
                             layers_per_block=1, down_block_types=("DownBlock2D",) * 2,
                             up_block_types=("UpBlock2D",) * 2, norm_num_groups=8).eval()
    compiled = compiled_unet(model, tc.randn(1, 3, 16, 16), tc.tensor([10.0]), backend)
    ups = sum(len(getattr(m, "resnets", ())) for m in model.up_blocks)
    assert compiled.plan_info()[0]["passes"]["place_concat"] == ups
    # the one left: the sinusoidal embedding's cos | sin (not made by convolutions)
    assert compiled.plan_info()[0]["graph"].count("concatenate(") == 1


def test_the_pass_leaves_what_it_must(backend):
    tc.manual_seed(1)
    w, b = conv_params(3, 3)
    conv = lambda x: F.conv2d(x, w, b, padding=1)  # noqa: E731

    cases = {
        "two samples": (lambda x: tc.cat([conv(x), conv(x * 2.0)], axis=1), tc.randn(2, 3, 4, 4)),
        "a part not from a convolution": (lambda x: tc.cat([conv(x), x * 2.0], axis=1), tc.randn(1, 3, 4, 4)),
        "a part returned": (lambda x: (lambda y: (tc.cat([y, conv(x * 2.0)], axis=1), y))(conv(x)),
                            tc.randn(1, 3, 4, 4)),
        "a part twice": (lambda x: (lambda y: tc.cat([y, y], axis=1))(conv(x)), tc.randn(1, 3, 4, 4)),
        "a view of a part": (lambda x: tc.cat([conv(x)[:, :2], conv(x * 2.0)], axis=1), tc.randn(1, 3, 4, 4)),
    }
    for name, (fn, x) in cases.items():
        graph = place_concat(traced(fn, x))
        assert "concatenate" in ops(graph) and "place_concat" not in graph.stats, name
        with tc.no_grad():
            _, got = compiled_twice(fn, x)
            want = fn(x)
        for g, w_ in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            np.testing.assert_array_equal(g.numpy(), w_.numpy(), err_msg=name)


def test_a_part_in_two_concatenations_is_placed_once(backend):
    tc.manual_seed(2)
    w, b = conv_params(3, 3)

    def fn(x):
        y, z = F.conv2d(x, w, b, padding=1), F.conv2d(x * 2.0, w, b, padding=1)
        return tc.cat([y, z], axis=1) + 1.0, tc.cat([z, F.conv2d(x * 3.0, w, b, padding=1)], axis=1)

    x = tc.randn(1, 3, 4, 4)
    graph = place_concat(traced(fn, x))
    assert graph.stats["place_concat"] == 1 and ops(graph).count("concatenate") == 1
    with tc.no_grad():
        _, got = compiled_twice(fn, x)
        for g, want in zip(got, fn(x)):
            np.testing.assert_array_equal(g.numpy(), want.numpy())


def test_the_pass_can_be_switched_off(backend):
    block = SkipJoin().eval()
    x = tc.randn(1, 4, 5, 6)
    with tc.no_grad():
        compiled, got = compiled_twice(block, x, passes={"place_concat": False})
        np.testing.assert_array_equal(got.numpy(), block(x).numpy())
    assert "place_concat" not in compiled.plan_info()[0]["passes"]
    assert "concatenate(" in compiled.plan_info()[0]["graph"]


def test_placed_plans_survive_the_disk_cache(tmp_path, backend):
    block = SkipJoin().eval()
    x = tc.randn(1, 4, 5, 6)
    with tc.no_grad():
        tc.compile(block, cache_dir=tmp_path)(x)
        loaded = tc.compile(block, cache_dir=tmp_path)
        got = loaded(x)
        got = loaded(x)
        want = block(x)
    assert loaded.cache_info().disk_loads == 1
    assert loaded.plan_info()[0]["passes"] == {} and "empty(" in loaded.plan_info()[0]["graph"]
    np.testing.assert_array_equal(got.numpy(), want.numpy())


# ----- out= of the convolutions ----------------------------------------------------------------
@pytest.mark.parametrize("op", ["conv2d", "group_norm_conv2d"])
def test_convolutions_write_into_out(backend, op):
    be = tc.get_backend()
    rng = np.random.default_rng(4)
    x = be.array(rng.standard_normal((1, 4, 5, 5)), dtype="float32")
    w = be.array(rng.standard_normal((6, 4, 3, 3)), dtype="float32")
    bias = be.array(rng.standard_normal(6), dtype="float32")
    norm = (be.array(np.ones(4), dtype="float32"), be.array(np.zeros(4), dtype="float32"), 2, 1e-5, "silu", None)
    call = getattr(be, op)
    lead = (x, norm, w) if op == "group_norm_conv2d" else (x, w)
    want = call(*lead, (1, 1), (1, 1), (1, 1), 1, bias, "silu")
    block = be.array(np.full((1, 10, 5, 5), 7.0), dtype="float32")
    got = call(*lead, (1, 1), (1, 1), (1, 1), 1, bias, "silu", out=block[:, 4:])
    host = tc.tensor(block).numpy()
    np.testing.assert_array_equal(host[:, 4:], tc.tensor(want).numpy())
    assert (host[:, :4] == 7.0).all() and tc.tensor(got).shape == (1, 6, 5, 5)
    for bad in (be.array(np.zeros((1, 5, 5, 5)), dtype="float32"), be.array(np.zeros((1, 6, 5, 5)), dtype="float64"),
                be.array(np.zeros((2, 6, 5, 5)), dtype="float32")[:1, :, :, :].swapaxes(2, 3)):
        with pytest.raises(ValueError, match=f"{op}: out must be"):
            call(*lead, (1, 1), (1, 1), (1, 1), 1, bias, "silu", out=bad)
