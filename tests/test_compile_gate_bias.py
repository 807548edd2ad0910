"""The gate-bias pass (passes/fuse_gate_bias.py) and the ``bias=`` of the backend op it
targets, ``gated_activation``: GEGLU's projection bias moves into the gate where the
gate alone reads the product, every other graph stays as it was, and compiled == eager
bit for bit on the CPU backends (the gate rounds ``y + bias`` as the separate add does)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import layers
import tensorcore as tc
import tensorcore.functional as F
from diffusion.models.activations import GEGLU
from tensorcore import backends
from tensorcore.compile.passes import DEFAULT, PASSES
from tensorcore.compile.passes.fuse_epilogue import fuse_epilogue
from tensorcore.compile.passes.fuse_gate_bias import fuse_gate_bias
from test_compile_fusion import traced
from test_compile_graph import ops
from test_compile_passes import compiled_twice


def gate_graph(fn, *args):
    """The graph of ``fn`` after epilogue fusion (which puts the bias in the product), then this pass."""
    return fuse_gate_bias(fuse_epilogue(traced(fn, *args)))


def test_the_pass_runs_after_epilogue_fusion_and_before_elementwise_fusion():
    assert PASSES["fuse_gate_bias"] is fuse_gate_bias
    assert DEFAULT.index("fuse_epilogue") < DEFAULT.index("fuse_gate_bias") < DEFAULT.index("fuse_elementwise")


def test_a_geglu_projection_gives_its_bias_to_the_gate(backend):
    tc.manual_seed(0)
    geglu = GEGLU(8, 12)
    x = tc.randn(2, 5, 8)
    with tc.no_grad():
        graph = gate_graph(geglu, x)
        assert ops(graph) == ["matmul", "gated_activation"] and graph.stats["fuse_gate_bias"] == 1
        gate = graph.nodes[-1]
        assert set(gate.kwargs) == {"bias"}
        compiled, got = compiled_twice(geglu, x)
        assert compiled.plan_info()[0]["passes"]["fuse_gate_bias"] == 1
        np.testing.assert_array_equal(got.numpy(), geglu(x).numpy())


def test_a_product_read_elsewhere_keeps_its_bias():
    tc.manual_seed(0)
    proj = layers.Linear(8, 24)

    def fn(x):
        y = proj(x)
        return F.gated_activation(y, "gelu"), y.sum()

    with tc.no_grad():
        graph = gate_graph(fn, tc.randn(3, 8))
    assert "fuse_gate_bias" not in graph.stats
    assert "matmul_bias_act" in ops(graph)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_backend_gate_adds_the_bias_first(backend, dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 10)).astype(dtype)
    bias = rng.standard_normal(10).astype(dtype)
    be = backends.get_backend()
    got = be.to_numpy(be.gated_activation(be.from_numpy(x), "silu", be.from_numpy(bias)))
    s = (x + bias).astype(np.float64)
    want = s[:, :5] * (s[:, 5:] / (1 + np.exp(-s[:, 5:])))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-6 if dtype == "float32" else 1e-12)


@settings(max_examples=10)
@given(rows=st.integers(1, 9), width=st.sampled_from([4, 8, 12]), act=st.sampled_from(["gelu", "silu", "relu"]),
       seed=st.integers(0, 50))
def test_compiled_gates_equal_eager_ones(rows, width, act, seed):
    tc.manual_seed(seed)
    proj = layers.Linear(6, 2 * width)

    def fn(x):
        return F.gated_activation(proj(x), act)

    x = tc.randn(rows, 6)
    with tc.no_grad():
        compiled, got = compiled_twice(fn, x)
        assert compiled.plan_info()[0]["passes"]["fuse_gate_bias"] == 1
        np.testing.assert_array_equal(got.numpy(), fn(x).numpy())
