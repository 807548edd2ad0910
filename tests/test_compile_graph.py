"""The stages on their own: the recorded graph, the passes, lowering and the memory plan."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, strategies as st

import layers
import tensorcore as tc
import tensorcore.functional as F
from tensorcore.compile import passes, plan, trace
from tensorcore.compile.graph import Graph, refs
from tensorcore.compile.passes.dce import dead_code_elimination


def record(fn, *inputs: tc.Tensor) -> Graph:
    """Trace ``fn`` on copies of ``inputs`` and return its graph."""
    backend = tc.get_backend()
    bufs = [t.data.copy() for t in inputs]
    tracer = trace.Tracer(backend, bufs, {}, lambda o: None, "raise", "test")
    with trace.recording(tracer):
        out = fn(*[tc.Tensor._wrap(b, backend.device) for b in bufs])
    template = trace.output_template(tracer, out, tc.Tensor)
    del out
    gc.collect()
    assert tracer.finish(template, lambda root: None) == []
    return tracer.graph


def ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes]


# ----- tracing -------------------------------------------------------------------------------
def test_graph_records_backend_calls_and_prints_as_a_table(backend):
    w = tc.randn(4, 3)
    graph = record(lambda x: F.silu(x @ w) + 1.0, tc.randn(2, 4))
    assert ops(graph) == ["matmul", "unary", "binary"]  # the Python scalar stays an argument
    table = graph.table()
    assert "matmul(" in table and "'silu'" in table and "input 0" in table and table.splitlines()[-1].startswith("  return")
    kinds = {s.kind for s in graph.storages}
    assert kinds >= {"input", "external", "fresh"}


def test_views_share_their_storage(backend):
    graph = record(lambda x: x.transpose(0, 1).reshape(-1)[1:] * 2, tc.randn(3, 4))
    transposed = graph.nodes[0].out
    assert graph.values[transposed.value].storage == graph.values[graph.inputs[0]].storage


def test_captured_host_data_is_a_constant(backend):
    graph = record(lambda x: x * tc.tensor([1.0, 2.0, 3.0]), tc.randn(3))
    lowered = plan.lower(dead_code_elimination(graph))
    constants = [graph.nodes[i] for i in lowered.init]
    assert [n.op for n in constants] == ["constant"]
    assert np.array_equal(tc.get_backend().to_numpy(constants[0].data), [1.0, 2.0, 3.0])


def test_host_read_of_data_raises_and_names_the_op(backend):
    with pytest.raises(trace.TraceError, match=r"Tensor\.item\(\).*test_compile_graph.py"):
        record(lambda x: x * x.sum().item(), tc.randn(3))


def test_recording_is_per_thread(backend):
    be = tc.get_backend()
    tracer = trace.Tracer(be, [], {}, lambda o: None, "raise", "test")
    seen = []
    with trace.recording(tracer):
        import threading

        t = threading.Thread(target=lambda: seen.append((tc.ones(2) * 2).numpy()))
        t.start()
        t.join()
    assert np.array_equal(seen[0], [2, 2]) and tracer.graph.nodes == []


def test_direct_array_module_use_is_refused(backend):
    with pytest.raises(trace.TraceError, match=r"backend\.xp\.add"):
        record(lambda x: tc.Tensor._wrap(x.backend.xp.add(x.data, 1), x.device), tc.randn(2))


# ----- passes ----------------------------------------------------------------------------------
def test_dce_drops_unused_calls_and_keeps_effects(backend):
    state = tc.zeros(3)

    def f(x):
        unused = tc.exp(x) * 3  # noqa: F841  (dead)
        with tc.no_grad():
            state.add_(x)  # writes external memory: kept
        F.dropout(x, 0.5)  # result unused, but the draw advances the generator: kept
        return x + 1

    graph = record(f, tc.randn(3))
    pruned = dead_code_elimination(graph)
    assert "unary" in ops(graph) and "unary" not in ops(pruned)
    assert "add_" in ops(pruned) and "uniform" in ops(pruned)
    assert len(graph.nodes) > len(pruned.nodes)  # the input graph is left as it was


def test_dce_drops_writes_into_dead_intermediates(backend):
    def f(x):
        z = x * 1.0
        z[0] = 5.0  # in-place write into an intermediate nobody reads
        return x + 1

    with tc.no_grad():
        graph = record(f, tc.randn(3))
    assert "setitem_" in ops(graph) and "setitem_" not in ops(dead_code_elimination(graph))


def test_custom_passes_run_in_order(backend):
    seen = []

    def spy(graph: Graph) -> Graph:
        seen.append(len(graph.nodes))
        return graph

    compiled = tc.compile(lambda x: (tc.exp(x), x * 2)[1], passes=[spy, "dce", spy], cache_dir=False)
    compiled(tc.ones(2))
    assert len(seen) == 2 and seen[0] > seen[1]
    with pytest.raises(TypeError, match="not a Graph"):
        tc.compile(lambda x: x + 1, passes=[lambda g: None], cache_dir=False)(tc.ones(2))
    assert passes.resolve([]) == () and passes.resolve(None) == tuple(passes.PASSES[n] for n in passes.DEFAULT)


# ----- lowering and the memory plan -----------------------------------------------------------
lifetimes = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10), st.integers(0, 5000)), min_size=1, max_size=40)


@given(spans=lifetimes, align=st.sampled_from([1, 64, 256]))
def test_memory_plan_never_overlaps_live_intermediates(spans, align):
    lives = {i: (start, start + length) for i, (start, length, _) in enumerate(spans)}
    sizes = {i: size for i, (_, _, size) in enumerate(spans)}
    offsets, arena = plan._place(lives, sizes, align)
    padded = {i: -(-max(sizes[i], 1) // align) * align for i in sizes}
    assert arena <= sum(padded.values())
    for i in lives:
        assert offsets[i] % align == 0 and offsets[i] + padded[i] <= arena
        for j in lives:
            if i < j and lives[i][0] <= lives[j][1] and lives[j][0] <= lives[i][1]:
                assert offsets[i] + padded[i] <= offsets[j] or offsets[j] + padded[j] <= offsets[i]


def test_a_chain_reuses_memory(backend):
    def chain(x):
        for _ in range(8):
            x = tc.tanh(x) * 1.5
        return x

    lowered = plan.lower(dead_code_elimination(record(chain, tc.randn(64, 64))))
    info = lowered.info()
    assert info["steps"] == 16 and info["arena_bytes"] <= info["intermediate_bytes"] // 4


def test_outputs_and_step_arguments_never_share_memory(backend):
    graph = dead_code_elimination(record(lambda x, y: (x * y, (x + y) * 2, tc.exp(x) - y), tc.randn(8), tc.randn(8)))
    lowered = plan.lower(graph)
    placed = {s: o for s, (kind, o) in lowered.placement.items() if kind == "arena"}
    outs = {graph.values[r.value].storage for r in graph.output_refs()}
    offsets = [placed[s] for s in outs]
    assert len(set(offsets)) == len(offsets)
    for index in lowered.steps:
        node = graph.nodes[index]
        used = {graph.values[r.value].storage for r in (*refs(node.args), *refs(node.out))}
        arena = [placed[s] for s in used if s in placed]
        assert len(arena) == len(set(arena))


def test_cpu_replay_of_primitives_allocates_nothing():
    with tc.use_backend("numpy"):
        f = lambda x, y: ((x + y) * y - x) / (y + 2.0)  # noqa: E731
        compiled = tc.compile(f, cache_dir=False, reuse_outputs=True)
        x, y = tc.randn(64, 64), tc.randn(64, 64)
        compiled(x, y), compiled(x, y)
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            compiled(x, y)
            peak = tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()
        assert peak < 64 * 64 * 4, peak  # less than one intermediate's worth


def test_a_plans_key_reads_as_text():
    model = layers.Linear(3, 2)
    compiled = tc.compile(lambda x, scale, m: m(x) * scale, cache_dir=False)
    with tc.no_grad():
        compiled(tc.randn(4, 3), 0.5, model)
    text = compiled.plan_info()[0]["key"]
    assert text.splitlines()[0] == "call(float32[4, 3] cpu, 0.5, <module>)"
    assert "grad=off" in text and "training=T" in text
