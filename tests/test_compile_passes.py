"""The graph passes of tc.compile: switches, common-subexpression elimination and
elementwise fusion, each on its own and all together, against eager results."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import layers
import optim
import tensorcore as tc
import tensorcore.functional as F
from tensorcore.backends import fused_program
from tensorcore.backends.cupy import fused_source
from tensorcore.compile import passes
from tensorcore.compile.passes.cse import common_subexpression_elimination
from tensorcore.compile.passes.fuse_elementwise import fuse_elementwise
from tensorcore.ops import elementwise as E
from test_compile_graph import ops, record

NVCC = shutil.which("nvcc")
CONFIGS = {"none": [], "dce": ["dce"], "cse": ["cse"], "fuse": ["fuse_elementwise"], "all": None}


def compiled_twice(fn, *args, **options):
    """The compiled callable and the result of its replay (the first call traces)."""
    compiled = tc.compile(fn, cache_dir=False, **options)
    compiled(*args)
    return compiled, compiled(*args)


def replays_without(pass_name: str, step, *args, atol: float) -> None:
    """A training step compiled: the pass did not run on it, and the replay's loss and
    gradients are the eager step's."""
    compiled, got = compiled_twice(step, *args)
    assert pass_name not in compiled.plan_info()[0]["passes"]
    for g, w in zip(got, step(*args)):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=atol)


def fused_count(compiled) -> int:
    return sum(info["fused"] for info in compiled.plan_info())


# ----- switches ------------------------------------------------------------------------------
def test_passes_dict_switches_the_default_pipeline():
    assert passes.resolve({"fuse_elementwise": False}) == tuple(
        passes.PASSES[name] for name in passes.DEFAULT if name != "fuse_elementwise")
    assert passes.resolve({}) == passes.resolve(None)
    with pytest.raises(ValueError, match="unknown pass 'fuse'.*known passes: cse, dce, .*fuse_elementwise"):
        tc.compile(lambda x: x, passes={"fuse": False})
    with pytest.raises(TypeError, match="True or False"):
        tc.compile(lambda x: x, passes={"cse": "no"})
    f = lambda x: tc.tanh(x * 2.0 + 1.0)  # noqa: E731
    x = tc.randn(3, 4)
    on, _ = compiled_twice(f, x)
    off, _ = compiled_twice(f, x, passes={"fuse_elementwise": False})
    listed, _ = compiled_twice(f, x, passes=["dce", "fuse_elementwise"])
    assert fused_count(on) == 1 and fused_count(off) == 0 and fused_count(listed) == 1


def test_pass_switches_are_part_of_the_disk_identity(tmp_path):
    f = lambda x: F.silu(x - 0.5) * 3.0  # noqa: E731
    x = tc.randn(4, 5)
    fused = tc.compile(f, cache_dir=tmp_path)
    fused(x)
    loaded = tc.compile(f, cache_dir=tmp_path)
    np.testing.assert_array_equal(loaded(x).numpy(), f(x).numpy())
    assert loaded.cache_info().disk_loads == 1 and fused_count(loaded) == 1  # the fused node survives JSON
    unfused = tc.compile(f, cache_dir=tmp_path, passes={"fuse_elementwise": False})
    unfused(x)
    assert unfused.cache_info().disk_loads == 0 and fused_count(unfused) == 0


# ----- common-subexpression elimination --------------------------------------------------------
def test_cse_merges_repeated_pure_calls(backend):
    w = tc.randn(4, 4)
    graph = record(lambda x: (x @ w).exp() + (x @ w).exp() * (x @ w), tc.randn(2, 4))
    merged = common_subexpression_elimination(graph)
    assert ops(graph).count("matmul") == 3 and ops(merged).count("matmul") == 1
    assert ops(merged).count("unary") == 1 and merged.stats["cse"] == 3
    x = tc.randn(2, 4)
    f = lambda x: (x @ w).exp() + (x @ w).exp() * (x @ w)  # noqa: E731
    compiled, out = compiled_twice(f, x, passes=["cse"])
    np.testing.assert_array_equal(out.numpy(), f(x).numpy())


def test_cse_keeps_static_arguments_of_other_types_and_random_draws(backend):
    graph = record(lambda x: (x * 2, x * 2.0, x * 2), tc.randn(4))
    assert ops(graph).count("binary") == 3
    assert ops(common_subexpression_elimination(graph)).count("binary") == 2  # int 2 and float 2.0 differ
    x = tc.randn(256)  # two equal masks of 256 draws: probability 2**-256
    f = lambda x: (F.dropout(x, 0.5, training=True), F.dropout(x, 0.5, training=True))  # noqa: E731
    compiled = tc.compile(f, cache_dir=False, passes=["cse"])
    compiled(x)
    a, b = compiled(x)
    assert not np.array_equal(a.numpy(), b.numpy())  # two draws stay two draws


def test_cse_never_merges_across_a_write_to_an_input(backend):
    def f(x, y):
        first = x * 3.0
        x.add_(y)  # x changes: the second x * 3.0 reads new values
        return first, x * 3.0

    x, y = tc.randn(5), tc.randn(5)
    graph = record(f, x, y)
    assert ops(common_subexpression_elimination(graph)).count("binary") == 2
    compiled = tc.compile(f, cache_dir=False)
    compiled(tc.tensor(x.numpy()), y)  # traced
    got = compiled(tc.tensor(x.numpy()), y)
    want = f(tc.tensor(x.numpy()), y)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


# ----- elementwise fusion ------------------------------------------------------------------------
def test_fusion_makes_one_call_of_a_chain_and_leaves_shared_results(backend):
    b = tc.randn(4)
    graph = record(lambda x: tc.where(x > 0, F.silu(x + b), x * 0.1) - 1.0, tc.randn(3, 4))
    fused = fuse_elementwise(graph)
    assert ops(fused) == ["fused_elementwise"] and fused.stats["fused_ops"] == len(graph.nodes)
    program, inputs = fused.nodes[0].args
    fused_program.check(program)
    assert len(inputs) == 2
    def shared(x):
        e = tc.exp(x)
        return e + 1.0, e * 2.0

    def returned(x):
        e = tc.exp(x)
        return e, e + 1.0

    assert ops(fuse_elementwise(record(shared, tc.randn(3)))) == ["unary", "binary", "binary"]  # e read twice
    assert ops(fuse_elementwise(record(returned, tc.randn(3)))) == ["unary", "binary"]  # e is returned


def test_fusion_needs_one_output_shape(backend):
    graph = record(lambda x, b: (b * 2.0 + 1.0) + x, tc.randn(3, 4), tc.randn(4))
    fused = fuse_elementwise(graph)
    assert ops(fused) == ["fused_elementwise", "binary"]  # [4] chain, then the broadcast add


UNARY_SAFE = ["neg", "abs", "tanh", "sigmoid", "silu", "relu", "gelu", "sin", "cos", "exp_tanh", "sqrt_abs",
              "softplus", "sign"]
BINARY_SAFE = ["add", "sub", "mul", "maximum", "minimum", "div_safe", "where_gt"]
SHAPES = [(3, 4), (4,), (1, 4), (3, 1), ()]


def _unary(name: str, x: tc.Tensor) -> tc.Tensor:
    if name == "exp_tanh":
        return E.exp(E.tanh(x))
    if name == "sqrt_abs":
        return E.sqrt(E.abs(x))
    return getattr(E, name)(x)


def _binary(name: str, a, b) -> tc.Tensor:
    if name == "div_safe":
        return a / (tc.abs(b) + 1.0) if isinstance(b, tc.Tensor) else a / (abs(b) + 1.0)
    if name == "where_gt":
        return tc.where(a > b, a, b * 0.5)
    if name in ("maximum", "minimum"):
        return getattr(tc, name)(a, b if isinstance(b, tc.Tensor) else tc.full_like(a, b))
    return {"add": a + b, "sub": a - b, "mul": a * b}[name]


@st.composite
def programs(draw):
    """A random elementwise graph: steps over two inputs of broadcastable shapes."""
    shapes = [draw(st.sampled_from(SHAPES)), draw(st.sampled_from(SHAPES))]
    steps = []
    for _ in range(draw(st.integers(2, 7))):
        if draw(st.booleans()):
            steps.append(("u", draw(st.sampled_from(UNARY_SAFE))))
        else:
            other = draw(st.one_of(st.integers(0, 1), st.floats(-2, 2, width=32)))
            steps.append(("b", draw(st.sampled_from(BINARY_SAFE)), other))
    seed = draw(st.integers(0, 2 ** 16))
    return shapes, steps, seed


def run_program(steps, inputs):
    x = inputs[0]
    kept = []
    for step in steps:
        if step[0] == "u":
            x = _unary(step[1], x)
        else:
            other = inputs[step[2]] if isinstance(step[2], int) else float(step[2])
            x = _binary(step[1], x, other)
        kept.append(x)
    return x


def check_program(program, backend: str, config: str) -> None:
    shapes, steps, seed = program
    rng = np.random.default_rng(seed)
    inputs = [tc.tensor(rng.uniform(-2, 2, s).astype(np.float32)) for s in shapes]
    fn = lambda a, b: run_program(steps, [a, b])  # noqa: E731
    compiled, got = compiled_twice(fn, *inputs, passes=CONFIGS[config])
    want = fn(*inputs).numpy()
    np.testing.assert_array_equal(got.numpy(), want)  # fused kernels round each op as eager does


@pytest.mark.parametrize("config", ["cse", "fuse", "all"])
@settings(max_examples=6)
@given(program=programs())
def test_hypothesis_graphs_compiled_equal_eager(backend, config, program):
    check_program(program, backend, config)


def test_fused_arithmetic_is_bit_identical_on_numba():
    with tc.use_backend("numba"):
        b = tc.randn(1, 16)
        f = lambda x: tc.where(x > 0.25, x * 1.5 - b, tc.maximum(x, b) / 3.0) + F.silu(x + b)  # noqa: E731
        x = tc.randn(32, 16)
        compiled, got = compiled_twice(f, x)
        assert fused_count(compiled) == 1
        np.testing.assert_array_equal(got.numpy(), f(x).numpy())


@pytest.mark.parametrize("steps", [
    [("b", "add", 1), ("u", "abs"), ("u", "gelu")],    # x >= 0 known: GELU's branch folds
    [("u", "relu"), ("u", "silu")],
    [("b", "mul", 0), ("u", "sigmoid")],
    [("u", "sqrt_abs"), ("u", "gelu")],
])
def test_activations_after_sign_fixing_ops_are_bit_identical_on_numba(steps):
    """Inside a fused kernel an activation's argument is a register whose sign the compiler
    may know; the kernel must still round as the eager calls do."""
    with tc.use_backend("numba"):
        for seed in range(4):
            check_program(([(64, 64), (64, 64)], steps, seed), "numba", "all")


def test_large_outputs_run_the_parallel_numba_kernel():
    with tc.use_backend("numba"):
        b, c = tc.randn(256), tc.randn(300, 1)
        f = lambda x, y: tc.where(x > 0, F.silu(x + b) * y.transpose(1, 0), x * c)  # noqa: E731
        x, y = tc.randn(300, 256), tc.randn(256, 300)  # 76800 elements: above SERIAL_BELOW
        compiled, got = compiled_twice(f, x, y)
        assert fused_count(compiled) == 1
        np.testing.assert_array_equal(got.numpy(), f(x, y).numpy())


def test_fused_kernel_handles_strided_and_broadcast_inputs(backend):
    f = lambda x, y: F.relu(x.transpose(1, 0) * 2.0 + y) - y  # noqa: E731
    x, y = tc.randn(5, 3), tc.randn(3, 1)
    compiled, got = compiled_twice(f, x, y)
    np.testing.assert_allclose(got.numpy(), f(x, y).numpy(), rtol=1e-6, atol=1e-7)


# ----- layers ---------------------------------------------------------------------------------
def _cnn() -> layers.Module:
    return layers.Sequential(layers.Conv2d(3, 8, 3, padding=1), layers.GroupNorm(2, 8), layers.SiLU(),
                             layers.Conv2d(8, 4, 1), layers.ReLU())


def _mlp() -> layers.Module:
    return layers.Sequential(layers.Linear(6, 16), layers.SiLU(), layers.LayerNorm(16), layers.Linear(16, 16),
                             layers.GELU(), layers.Dropout(0.0), layers.Linear(16, 3), layers.Sigmoid())


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("make, shape", [(_mlp, (4, 6)), (_cnn, (2, 3, 6, 6))])
def test_layers_compiled_equal_eager(backend, config, make, shape):
    tc.manual_seed(0)
    model = make().eval()
    x = tc.randn(*shape)
    with tc.no_grad():
        compiled, got = compiled_twice(model, x, passes=CONFIGS[config])
        want = model(x).numpy()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    if config == "fuse" and make is _mlp:
        assert fused_count(compiled) >= 2  # bias + SiLU, bias + GELU
    if config == "all" and make is _mlp:  # each Linear and its activation: one GEMM with an epilogue
        assert compiled.plan_info()[0]["passes"]["fuse_epilogue"] == 6


def test_train_step_with_every_pass_matches_eager(backend):
    def make():
        tc.manual_seed(1)
        model = _mlp().train()
        return model, optim.Adam(model.parameters(), lr=1e-2)

    x, y = tc.randn(4, 6), tc.rand(4, 3)
    losses = []
    for compile_it in (False, True):
        model, opt = make()

        def step():
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss

        run = tc.compile(step, cache_dir=False) if compile_it else step
        losses.append([float(run().numpy()) for _ in range(5)])
        if compile_it:
            assert run.plan_info()[0]["passes"].get("cse", 0) >= 1  # mse's backward repeats g * diff
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)


# ----- generated sources ---------------------------------------------------------------------------
EVERY_OP = (("float32", "float32", "bool"), (
    ("const", "float32", 0.5), ("const", "float32", float("-inf")),
    *[("unary", op, 0) for op in fused_program.UNARY_FLOAT],
    ("unary", "isnan", 1), ("unary", "isinf", 1), ("unary", "logical_not", 2),
    *[("act", act, 1) for act in fused_program.ACTS],
    *[("binary", op, 0, 1) for op in fused_program.ARITHMETIC + fused_program.COMPARISONS],
    ("binary", "logical_and", 2, 2), ("binary", "logical_or", 2, 2),
    ("where", 2, 0, 3)))


def test_generated_cuda_source_holds_no_user_text():
    kernel = fused_source.kernel_source(EVERY_OP, 3)
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", kernel))
    allowed = {"extern", "C", "__global__", "void", "fused_elementwise", "const", "float", "double", "bool", "asm",
               "volatile", "f",
               "__restrict__", "long", "out", "n", "step", "gridDim", "x", "blockDim", "narrow", "for", "i",
               "blockIdx", "threadIdx", "rest", "divmod_index", "true", "false", "__int_as_float", "int",
               "u", "unary_op", "act_fwd", "binary_op", "__fadd_rn", "__fsub_rn", "__fmul_rn", "LL"}
    allowed |= set(fused_source.UNARY_CODES.values()) | {f"ACT_{a.upper()}" for a in fused_program.ACTS}
    allowed |= {"B_DIV", "B_POW", "B_MAXIMUM", "B_MINIMUM"}
    unexpected = {w for w in words if w not in allowed and not re.fullmatch(r"[acdrs]\d+(_\d+)?|x[0-9a-f]+u?", w)}
    assert not unexpected, unexpected
    for bad in [(("float32",), (("unary", "exp); system(\"rm\"", 0),)),
                (("float32",), (("const", "float32", "1); evil("),)),
                (("float32",), (("binary", "add", 0, 7),)), (("int32",), (("unary", "neg", 0),))]:
        with pytest.raises(ValueError, match="fused_elementwise"):
            fused_source.kernel_source(bad, 1)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("rank, dtype", [(1, "float32"), (4, "float64")])
def test_generated_cuda_source_compiles_for_sm90(tmp_path, rank, dtype):
    program = (tuple(dtype if d == "float32" else d for d in EVERY_OP[0]),
               tuple(tuple(dtype if x == "float32" else x for x in ins) for ins in EVERY_OP[1]))
    (tmp_path / "fused.cu").write_text(fused_source.source(program, rank))
    result = subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "-ptx", str(tmp_path / "fused.cu"),
                             "-o", str(tmp_path / "fused.ptx")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert ".entry fused_elementwise" in (tmp_path / "fused.ptx").read_text()


def test_every_op_runs_on_the_cpu_backends():
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(0.1, 2, (3, 4)).astype(np.float32), rng.uniform(-2, 2, (4,)).astype(np.float32),
              rng.uniform(size=(3, 1)) > 0.5]
    results = {}
    for name in ("numpy", "numba"):
        with tc.use_backend(name):
            results[name] = tc.get_backend().fused_elementwise(EVERY_OP, inputs)
    np.testing.assert_allclose(results["numba"], results["numpy"], rtol=1e-6)


@pytest.mark.gpu
def test_fused_kernels_equal_eager_on_cupy():
    with tc.use_backend("cupy"):
        b = tc.randn(16, device="cuda")
        f = lambda x: tc.where(x > 0.25, x * 1.5 - b, tc.maximum(x, b) / 3.0) + F.silu(x + b).exp()  # noqa: E731
        x = tc.randn(8, 16, device="cuda")
        compiled, got = compiled_twice(f, x)
        assert fused_count(compiled) == 1
        np.testing.assert_allclose(got.numpy(), f(x).numpy(), rtol=1e-6, atol=1e-6)
        rng = np.random.default_rng(0)
        host = [rng.uniform(0.1, 2, (3, 4)).astype(np.float32), rng.uniform(-2, 2, (4,)).astype(np.float32),
                rng.uniform(size=(3, 1)) > 0.5]
        backend = tc.get_backend()
        gpu = backend.to_numpy(backend.fused_elementwise(EVERY_OP, [backend.from_numpy(a) for a in host]))
    with tc.use_backend("numpy"):
        ref = tc.get_backend().fused_elementwise(EVERY_OP, host)
    np.testing.assert_allclose(gpu, ref, rtol=1e-5, atol=1e-6)
