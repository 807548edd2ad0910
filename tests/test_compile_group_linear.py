"""The grouping pass (passes/group_linear.py) and the backend op it targets,
``matmul_bias_act_group``, on every backend: few-row products of one input become one
call where each can move to the first one's place, every other graph stays as it was,
and compiled == eager bit for bit (the grouped kernel computes each column as the
single-product kernel does)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import layers
import tensorcore as tc
import tensorcore.functional as F
from tensorcore.compile.passes import DEFAULT, PASSES
from tensorcore.compile.passes.fuse_epilogue import fuse_epilogue
from tensorcore.compile.passes.group_linear import FEW_ROWS, group_linear
from test_compile_fusion import compiled_unet, small_unet, traced
from test_compile_graph import ops
from test_compile_passes import compiled_twice


def grouped(fn, *args):
    """The graph of ``fn`` after epilogue fusion (which makes the products), then this pass."""
    return group_linear(fuse_epilogue(traced(fn, *args)))


def assert_equal(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def projections(outs=(6, 10, 4), acts=("none", "silu", "none"), bias=(True, True, False), k=16):
    """Linears of one input, as a UNet's ResBlocks project its time embedding."""
    tc.manual_seed(1)
    heads = [layers.Linear(k, n, bias=b) for n, b in zip(outs, bias)]

    def fn(e):
        return tuple(F.silu(h(e)) if act == "silu" else h(e) for h, act in zip(heads, acts))
    return fn, heads


def test_the_pass_runs_after_epilogue_fusion_and_before_elementwise_fusion():
    assert PASSES["group_linear"] is group_linear
    assert DEFAULT.index("fuse_epilogue") < DEFAULT.index("group_linear") < DEFAULT.index("fuse_elementwise")


def test_products_of_one_input_become_one_call(backend):
    fn, heads = projections()
    e = tc.randn(2, 16)
    graph = grouped(fn, e)
    assert ops(graph) == ["matmul_bias_act_group"] and graph.stats["group_linear"] == 3
    node = graph.nodes[0]
    assert [act for _, _, act in node.args[1]] == ["none", "silu", "none"]
    assert node.args[1][2][1] is None  # the Linear without a bias
    assert len(node.out) == 3
    with tc.no_grad():
        compiled, got = compiled_twice(fn, e)
        assert compiled.plan_info()[0]["passes"]["group_linear"] == 3
        assert_equal(got, fn(e))


@settings(max_examples=12)
@given(rows=st.integers(1, FEW_ROWS), k=st.sampled_from([8, 16, 24]), outs=st.lists(st.integers(1, 40), min_size=2,
                                                                                  max_size=5),
       data=st.data())
def test_grouped_results_equal_eager_ones(rows, k, outs, data):
    acts = tuple(data.draw(st.sampled_from(["none", "silu", "gelu", "relu"])) for _ in outs)
    bias = tuple(data.draw(st.booleans()) for _ in outs)
    fn, _ = projections(tuple(outs), acts, bias, k)
    e = tc.randn(rows, k)
    with tc.no_grad():
        compiled, got = compiled_twice(fn, e)
        assert compiled.plan_info()[0]["passes"]["group_linear"] == len(outs)
        assert_equal(got, fn(e))


def test_the_unet_time_embedding_projections_run_as_one_call(backend):
    model = small_unet()
    compiled = compiled_unet(model, tc.randn(1, 3, 16, 16), tc.tensor([10.0]), backend)
    resnets = sum(type(m).__name__ == "ResnetBlock2D" for m in model.modules())
    assert compiled.plan_info()[0]["graph"].count("matmul_bias_act_group(") == 1
    assert compiled.plan_info()[0]["passes"]["group_linear"] == resnets


def test_the_pass_leaves_what_it_must(backend):
    tc.manual_seed(2)
    e, wide = tc.randn(1, 8), tc.randn(FEW_ROWS + 1, 8)
    a, b = layers.Linear(8, 4), layers.Linear(8, 4)

    def weight_made_later(e):  # b's weight is computed after a's product: it cannot move up
        return a(e), e @ (b.weight * 2.0).T

    def many_rows(x):
        return a(x), b(x)

    def weight_written_between(e):
        first = a(e)
        with tc.no_grad():
            b.weight.mul_(1.0)
        return first, b(e)

    def other_inputs(e):
        return a(e), b(e * 2.0)

    for fn, x in ((weight_made_later, e), (many_rows, wide), (other_inputs, e)):
        graph = grouped(fn, x)
        assert "matmul_bias_act_group" not in ops(graph), fn.__name__
        with tc.no_grad():
            compiled, got = compiled_twice(fn, x)
            assert "group_linear" not in compiled.plan_info()[0]["passes"], fn.__name__
            assert_equal(got, fn(x))
    with tc.no_grad():
        graph = grouped(weight_written_between, e)
        assert "matmul_bias_act_group" not in ops(graph)


def test_the_pass_can_be_switched_off(backend):
    fn, _ = projections()
    e = tc.randn(1, 16)
    with tc.no_grad():
        compiled, got = compiled_twice(fn, e, passes={"group_linear": False})
    assert "group_linear" not in compiled.plan_info()[0]["passes"]
    assert "matmul_bias_act_group" not in compiled.plan_info()[0]["graph"]
    assert_equal(got, fn(e))


# ----- the backend op ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_op_is_each_product_as_its_own_call(backend, dtype):
    be = tc.get_backend()
    rng = np.random.default_rng(3)
    a = be.array(rng.standard_normal((3, 16)), dtype=dtype)
    products = [(be.array(rng.standard_normal((16, n)), dtype=dtype),
                 None if n == 7 else be.array(rng.standard_normal(n), dtype=dtype), act)
                for n, act in ((5, "none"), (7, "silu"), (40, "gelu"))]
    got = be.matmul_bias_act_group(a, tuple(products))
    assert isinstance(got, tuple) and len(got) == 3
    for g, (b, bias, act) in zip(got, products):
        np.testing.assert_array_equal(tc.tensor(g).numpy(), tc.tensor(be.matmul_bias_act(a, b, bias, act)).numpy())


def test_the_op_checks_its_arguments(backend):
    be = tc.get_backend()
    a, b = be.array(np.ones((1, 4)), dtype="float32"), be.array(np.ones((4, 2)), dtype="float32")
    for bad in ((), [(b, None)], (b,), None):
        with pytest.raises(TypeError, match="matmul_bias_act_group: products"):
            be.matmul_bias_act_group(a, bad)
    with pytest.raises(ValueError, match="matmul_bias_act_group"):
        be.matmul_bias_act_group(a, ((b, None, "swish"),))
