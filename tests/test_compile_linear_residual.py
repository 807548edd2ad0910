"""Epilogue fusion of a skip connection into a product (passes/fuse_epilogue.py):
``x + linear(h)`` becomes one ``matmul_bias_act(..., residual=x)`` call; nothing folds
after the residual; compiled == eager bit for bit on the CPU backends (every backend adds
the residual to the stored product as the separate add does), on a transformer block too."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

import layers
import tensorcore as tc
import tensorcore.functional as F
from diffusion.models.transformer_2d import BasicTransformerBlock
from tensorcore.compile.passes.fuse_epilogue import fuse_epilogue
from test_compile_fusion import traced
from test_compile_graph import ops
from test_compile_passes import compiled_twice


def test_a_skip_around_a_linear_is_one_call(backend):
    tc.manual_seed(0)
    lin = layers.Linear(8, 8)

    def fn(x, h):
        return x + lin(h)

    x, h = tc.randn(3, 8), tc.randn(3, 8)
    with tc.no_grad():
        graph = fuse_epilogue(traced(fn, x, h))
        assert ops(graph) == ["matmul_bias_act"] and "residual" in graph.nodes[0].kwargs
        compiled, got = compiled_twice(fn, x, h)
        np.testing.assert_array_equal(got.numpy(), fn(x, h).numpy())


def test_nothing_folds_after_the_residual():
    tc.manual_seed(0)
    lin = layers.Linear(8, 8)

    def fn(x, h):
        return F.silu(lin(h) + x)

    with tc.no_grad():
        graph = fuse_epilogue(traced(fn, tc.randn(3, 8), tc.randn(3, 8)))
    assert ops(graph) == ["matmul_bias_act", "unary"]
    assert graph.nodes[0].args[3] == "none" and "residual" in graph.nodes[0].kwargs


def test_a_residual_of_another_shape_is_not_folded():
    tc.manual_seed(0)
    lin = layers.Linear(8, 8)

    def fn(x, h):
        return lin(h) + x  # x broadcasts over the rows

    with tc.no_grad():
        graph = fuse_epilogue(traced(fn, tc.randn(1, 8), tc.randn(3, 8)))
    assert "residual" not in graph.nodes[0].kwargs and "binary" in ops(graph)


@settings(max_examples=6)
@given(tokens=st.integers(1, 12), seed=st.integers(0, 20))
def test_transformer_blocks_compiled_equal_eager(backend, tokens, seed):
    tc.manual_seed(seed)
    block = BasicTransformerBlock(16, 2, 8, cross_attention_dim=12).eval()
    h, context = tc.randn(2, tokens, 16), tc.randn(2, 5, 12)
    with tc.no_grad():
        graph = fuse_epilogue(traced(block, h, context))
        compiled, got = compiled_twice(block, h, context)
        want = block(h, context)
    skips = [n for n in graph.nodes if n.op == "matmul_bias_act" and "residual" in n.kwargs]
    assert len(skips) == 3  # the two attention outputs' and the feed-forward's
    np.testing.assert_array_equal(got.numpy(), want.numpy())
