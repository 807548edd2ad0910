"""Epilogue fusion and norm fusion: where each rewrite fires, where it must not, the
backend ops it targets (``matmul_bias_act``, GroupNorm's ``shift``) against the NumPy
reference, and compiled == eager on a small UNet.

On the CPU backends the fused calls run the very operations of the eager calls in the
same order, so results are compared bit for bit.  On CuPy the convolution's epilogue is
applied in the GEMM kernel's registers (a fused multiply-add may round once where eager
rounds twice), so GPU comparisons allow float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import diffusion
import layers
from diffusion.models.resnet import ResnetBlock2D
import tensorcore as tc
import tensorcore.functional as F
from tensorcore.compile.passes import DEFAULT, PASSES
from tensorcore.compile.passes.dce import dead_code_elimination
from tensorcore.compile.passes.fuse_epilogue import fuse_epilogue
from tensorcore.compile.passes.fuse_norm import fuse_norm
from tensorcore.ops.elementwise import Unary
from test_compile_graph import ops, record
from test_compile_passes import compiled_twice

ACTS = ["relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"]


def assert_matches(got, want, backend: str) -> None:
    """Bit for bit on the CPU; float32 rounding on CuPy (see the module doc).  Tuples
    of tensors are compared item by item."""
    if isinstance(got, tuple):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_matches(g, w, backend)
        return
    if backend == "cupy":
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2e-5, atol=2e-5)
    else:
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def check_compiled(fn, *args, backend: str, passes=None) -> dict:
    """fn compiled (replayed) == fn eager; returns what the passes did."""
    compiled, got = compiled_twice(fn, *args, passes=passes)
    assert_matches(got, fn(*args), backend)
    return compiled.plan_info()[0]["passes"]


def traced(fn, *args):
    """The graph of ``fn`` as the pipeline hands it to the fusion passes (after DCE,
    which drops the calls that only make views)."""
    return dead_code_elimination(record(fn, *args))


def train_step(loss_fn, module: layers.Module):
    """A function running ``loss_fn`` and its backward, returning the loss and the
    gradients (taken off the parameters, so the call keeps no tensor it made)."""
    def step(*args):
        loss = loss_fn(*args)
        loss.backward()
        grads = tuple(p.grad for p in module.parameters())
        for p in module.parameters():
            p.grad = None
        return (loss, *grads)
    return step


def conv_params(cin: int = 3, cout: int = 4, k: int = 3) -> tuple[tc.Tensor, tc.Tensor]:
    return tc.randn(cout, cin, k, k) * 0.3, tc.randn(cout)


# ----- epilogue fusion: convolution ------------------------------------------------------------
def test_pipeline_runs_the_new_passes_before_elementwise_fusion():
    assert DEFAULT.index("fuse_epilogue") < DEFAULT.index("fuse_elementwise")
    assert DEFAULT.index("fuse_norm") < DEFAULT.index("fuse_elementwise")
    assert PASSES["fuse_epilogue"] is fuse_epilogue and PASSES["fuse_norm"] is fuse_norm


@pytest.mark.parametrize("form", ["add_scale", "radd_rmul", "div_pow2"])
def test_residual_and_scale_fold_into_the_conv(backend, form):
    w, b = conv_params()
    x, r = tc.randn(2, 3, 6, 6), tc.randn(2, 4, 6, 6)

    def f(x, r):
        y = F.conv2d(x, w, b, padding=1)
        if form == "add_scale":
            return (y + r) * 0.7
        if form == "radd_rmul":
            return 3 * (r + y)
        return (y + r) / 4.0

    graph = fuse_epilogue(traced(f, x, r))
    assert ops(graph) == ["conv2d"] and graph.stats["fuse_epilogue"] == 2
    kwargs = graph.nodes[0].kwargs
    scale = {"add_scale": float(np.float32(0.7)), "radd_rmul": 3.0, "div_pow2": 0.25}[form]
    assert set(kwargs) == {"bias", "residual", "residual_scale"} and kwargs["residual_scale"] == scale
    assert check_compiled(f, x, r, backend=backend)["fuse_epilogue"] == 2


@pytest.mark.parametrize("shortcut_first", [False, True])
def test_a_residual_shared_by_two_convs_goes_to_the_spatial_one(backend, shortcut_first):
    """shortcut(x) + conv3x3(h): either operand could take the other as its residual; the
    3x3 convolution takes it (a 1x1 one may be a GEMM with its epilogue outside), in
    whichever order the two were computed."""
    w3, b3 = conv_params(3, 4)
    w1, b1 = conv_params(3, 4, k=1)
    x, h = tc.randn(2, 3, 5, 5), tc.randn(2, 3, 5, 5)

    def f(x, h):
        if shortcut_first:
            s = F.conv2d(x, w1, b1)
            return s + F.conv2d(h, w3, b3, padding=1)
        y = F.conv2d(h, w3, b3, padding=1)
        return F.conv2d(x, w1, b1) + y

    graph = fuse_epilogue(traced(f, x, h))
    assert ops(graph) == ["conv2d", "conv2d"] and graph.stats["fuse_epilogue"] == 1
    fused = [n for n in graph.nodes if "residual" in n.kwargs]
    assert len(fused) == 1 and graph.values[fused[0].args[1].value].shape[2:] == (3, 3)
    assert check_compiled(f, x, h, backend=backend)["fuse_epilogue"] == 1


@pytest.mark.parametrize("act", ACTS)
def test_activation_folds_into_a_conv_and_bias_act_into_a_conv_without_bias(backend, act):
    w, b = conv_params()
    x = tc.randn(2, 3, 5, 5)
    unary = lambda x: Unary.apply(F.conv2d(x, w, b, padding=1), act)  # noqa: E731
    biased = lambda x: F.bias_act(F.conv2d(x, w, padding=1), b, act, 1)  # noqa: E731
    for fn, kwargs in ((unary, {"bias", "act"}), (biased, {"bias", "act"})):
        graph = fuse_epilogue(traced(fn, x))
        assert ops(graph) == ["conv2d"] and set(graph.nodes[0].kwargs) == kwargs
        assert graph.nodes[0].kwargs["act"] == act
        if backend == "numba" and act in ("tanh", "gelu"):  # see the next test
            compiled, got = compiled_twice(fn, x)
            np.testing.assert_allclose(got.numpy(), fn(x).numpy(), rtol=1e-6, atol=1e-7)
            passes = compiled.plan_info()[0]["passes"]
        else:
            passes = check_compiled(fn, x, backend=backend)
        assert passes["fuse_epilogue"] == 1


def test_tanh_epilogue_on_numba_is_within_rounding():
    """Numba's eager tanh is NumPy's; its fused epilogue uses the kernel's own tanh."""
    with tc.use_backend("numba"):
        w, b = conv_params()
        x = tc.randn(2, 3, 5, 5)
        fn = lambda x: tc.tanh(F.conv2d(x, w, b, padding=1))  # noqa: E731
        compiled, got = compiled_twice(fn, x)
        assert compiled.plan_info()[0]["passes"]["fuse_epilogue"] == 1
        np.testing.assert_allclose(got.numpy(), fn(x).numpy(), rtol=1e-6, atol=1e-7)


def test_epilogue_keeps_its_order_of_operations(backend):
    w, b = conv_params()
    x, r = tc.randn(1, 3, 4, 4), tc.randn(1, 4, 4, 4)
    cases = {
        "scale before residual": (lambda x, r: F.conv2d(x, w, b, padding=1) * 0.5 + r, ["conv2d", "binary"]),
        "act after residual": (lambda x, r: F.relu(F.conv2d(x, w, b, padding=1) + r), ["conv2d", "unary"]),
        "second scale": (lambda x, r: F.conv2d(x, w, b, padding=1) * 0.5 * 3.0, ["conv2d", "binary"]),
        "division by 3": (lambda x, r: F.conv2d(x, w, b, padding=1) / 3.0, ["conv2d", "binary"]),
        "bias_act after the bias": (lambda x, r: F.bias_act(F.conv2d(x, w, b, padding=1), b, "silu", 1),
                                    ["conv2d", "bias_act"]),
    }
    for name, (fn, want) in cases.items():
        assert ops(fuse_epilogue(traced(fn, x, r))) == want, name
        check_compiled(fn, x, r, backend=backend)


def test_epilogue_leaves_results_read_elsewhere(backend):
    w, b = conv_params()
    x, r = tc.randn(1, 3, 4, 4), tc.randn(1, 4, 4, 4)

    def read_twice(x, r):
        y = F.conv2d(x, w, b, padding=1)
        return (y + r) * y

    def returned(x, r):
        y = F.conv2d(x, w, b, padding=1)
        return y, y + r

    def viewed(x, r):
        y = F.conv2d(x, w, b, padding=1)
        return y + y.flip(3)

    cases = {
        "read twice": (read_twice, ["conv2d", "binary", "binary"]),
        "returned": (returned, ["conv2d", "binary"]),
        "read through a view": (viewed, None),
        "broadcast residual": (lambda x, r: F.conv2d(x, w, b, padding=1) + r[:, :, :1, :1], None),
        "activation without an epilogue": (lambda x, r: tc.exp(F.conv2d(x, w, b, padding=1)), ["conv2d", "unary"]),
        "an array scale": (lambda x, r: F.conv2d(x, w, b, padding=1) * tc.tensor(2.0), None),
    }
    for name, (fn, want) in cases.items():
        graph = traced(fn, x, r)
        fused = fuse_epilogue(graph)
        assert "fuse_epilogue" not in fused.stats and ops(fused) == ops(graph), name
        assert want is None or ops(fused) == want, name
        check_compiled(fn, x, r, backend=backend)


def test_activation_stays_in_a_training_graph(backend):
    """The activation's backward reads the conv's result, so it is not the only reader."""
    conv = layers.Conv2d(3, 4, 3, padding=1)
    x = tc.randn(2, 3, 5, 5)

    graph = fuse_epilogue(traced(train_step(lambda x: F.silu(conv(x)).sum(), conv), x))
    assert all(not n.kwargs.get("act") for n in graph.nodes if n.op == "conv2d")
    assert "unary" in ops(graph)


# ----- epilogue fusion: GEMM -------------------------------------------------------------------
@pytest.mark.parametrize("act", ["none", *ACTS])
def test_matmul_and_bias_act_become_one_call(backend, act):
    w, b = tc.randn(6, 5), tc.randn(5)
    x = tc.randn(2, 3, 6)
    fn = lambda x: F.bias_act(x @ w, b, act, -1)  # noqa: E731
    graph = fuse_epilogue(traced(fn, x))
    assert ops(graph) == ["matmul_bias_act"] and graph.nodes[0].args[3] == act
    with tc.no_grad():
        check_compiled(fn, x, backend=backend)


def test_linear_then_silu_is_one_gemm_epilogue(backend):
    lin = layers.Linear(8, 4)
    fn = lambda x: F.silu(lin(x))  # noqa: E731
    x = tc.randn(5, 8)
    graph = fuse_epilogue(traced(fn, x))
    assert ops(graph) == ["matmul_bias_act"] and graph.nodes[0].args[3] == "silu"
    assert graph.stats["fuse_epilogue"] == 2
    with tc.no_grad():
        assert check_compiled(fn, x, backend=backend)["fuse_epilogue"] == 2


def test_gemm_epilogue_leaves_shared_products(backend):
    w, b = tc.randn(6, 4), tc.randn(4)

    def shared(x):
        y = x @ w
        return F.bias_act(y, b, "relu", -1) + y

    def other_axis(x):
        return F.bias_act(x @ w.transpose(0, 1)[:, :3], tc.randn(5), "none", 0)

    for fn, x in ((shared, tc.randn(5, 6)), (other_axis, tc.randn(5, 4))):
        graph = traced(fn, x)
        assert ops(fuse_epilogue(graph)) == ops(graph)


class _Block(layers.Module):
    """A Linear + SiLU beside a GroupNorm (with a shift) + SiLU -> conv + residual."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.conv, self.gn = layers.Linear(4, 8), layers.Conv2d(2, 2, 3, padding=1), layers.GroupNorm(2, 2)

    def forward(self, x: tc.Tensor, v: tc.Tensor, emb: tc.Tensor) -> tuple[tc.Tensor, tc.Tensor]:
        return self.conv(F.silu(self.gn(x + emb[:, :, None, None]))) + x, F.silu(self.lin(v))


def test_fused_plans_survive_the_disk_cache(tmp_path, backend):
    block = _Block().eval()
    args = (tc.randn(1, 2, 4, 4), tc.randn(3, 4), tc.randn(1, 2))
    with tc.no_grad():
        first = tc.compile(block, cache_dir=tmp_path)
        first(*args)
        loaded = tc.compile(block, cache_dir=tmp_path)
        got = loaded(*args)
        want = block(*args)
    assert loaded.cache_info().disk_loads == 1
    table = first.plan_info()[0]["graph"]
    assert "matmul_bias_act" in table and "group_norm_conv2d(" in table and "residual=" in table
    assert_matches(got, want, backend)


# ----- norm fusion -----------------------------------------------------------------------------
SHIFTS = {"[N, C, 1, 1]": lambda e: e[:, :, None, None], "[1, C, 1, 1]": lambda e: e[:1, :, None, None],
          "[C, 1, 1]": lambda e: e[0, :, None, None]}


@pytest.mark.parametrize("shape", list(SHIFTS))
@pytest.mark.parametrize("act", ["none", "silu"])
def test_time_embedding_add_folds_into_group_norm(backend, shape, act):
    gn = layers.GroupNorm(2, 4)
    x, emb = tc.randn(2, 4, 3, 3), tc.randn(2, 4)
    fn = lambda x, emb: F.group_norm(SHIFTS[shape](emb) + x, 2, gn.weight, gn.bias, act=act)  # noqa: E731
    graph = fuse_norm(traced(fn, x, emb))
    assert ops(graph) == ["group_norm"] and graph.stats["fuse_norm"] == 1
    shift = graph.values[graph.nodes[0].kwargs["shift"].value]
    assert shift.shape == (2, 4)
    with tc.no_grad():
        assert check_compiled(fn, x, emb, backend=backend)["fuse_norm"] == 1


@pytest.mark.parametrize("act", ACTS)
def test_activation_folds_into_group_norm(backend, act):
    gn = layers.GroupNorm(2, 4)
    x = tc.randn(2, 4, 3, 3)
    fn = lambda x: Unary.apply(gn(x), act)  # noqa: E731
    graph = fuse_norm(traced(fn, x))
    assert ops(graph) == ["group_norm"] and graph.nodes[0].kwargs == {"act": act}
    with tc.no_grad():
        if act in ("tanh", "gelu") and backend == "numba":  # last bit: see test_tanh_epilogue_on_numba_is_within_rounding
            compiled, got = compiled_twice(fn, x)
            np.testing.assert_allclose(got.numpy(), fn(x).numpy(), rtol=1e-6, atol=1e-7)
        else:
            check_compiled(fn, x, backend=backend)


def test_shift_and_activation_fold_together(backend):
    block = layers.GroupNorm(2, 6)
    x, emb = tc.randn(2, 6, 4, 4), tc.randn(2, 6)
    fn = lambda x, emb: F.silu(block(x + emb[:, :, None, None]))  # noqa: E731
    graph = fuse_norm(traced(fn, x, emb))
    assert ops(graph) == ["group_norm"] and set(graph.nodes[0].kwargs) == {"act", "shift"}
    assert graph.stats["fuse_norm"] == 2
    with tc.no_grad():
        check_compiled(fn, x, emb, backend=backend)


def test_norm_fusion_leaves_what_it_must(backend):
    gn = layers.GroupNorm(2, 4)
    x, emb = tc.randn(2, 4, 3, 3), tc.randn(2, 4)
    wrong = tc.randn(1, 1, 3, 3)

    def read_twice(x, emb):
        s = x + emb[:, :, None, None]
        return gn(s) + s

    def returned(x, emb):
        s = x + emb[:, :, None, None]
        return gn(s), s

    def norm_returned(x, emb):
        y = gn(x)
        return y, F.silu(y)

    cases = {
        "sum read twice": read_twice,
        "sum returned": returned,
        "spatial shift": lambda x, emb: gn(x + wrong),
        "per-position shift": lambda x, emb: gn(x + x[:, :, :, :1]),
        "normalised result returned": norm_returned,
        "no such activation": lambda x, emb: tc.exp(gn(x)),
        "activation already there": lambda x, emb: F.relu(F.group_norm(x, 2, gn.weight, gn.bias, act="silu")),
    }
    for name, fn in cases.items():
        graph = traced(fn, x, emb)
        fused = fuse_norm(graph)
        assert ops(fused) == ops(graph) and "fuse_norm" not in fused.stats, name
        with tc.no_grad():
            check_compiled(fn, x, emb, backend=backend)


def test_norm_fusion_stays_out_of_training_graphs(backend):
    """The backward of group_norm reads the sum: the add must stay."""
    gn = layers.GroupNorm(2, 4)
    x, emb = tc.randn(2, 4, 3, 3), tc.randn(2, 4)

    step = train_step(lambda x, emb: F.silu(gn(x + emb[:, :, None, None])).sum(), gn)
    graph = traced(step, x, emb)
    fused = fuse_norm(graph)
    assert ops(fused) == ops(graph) and "group_norm_backward" in ops(graph)
    compiled, got = compiled_twice(step, x, emb)
    assert "fuse_norm" not in compiled.plan_info()[0]["passes"]
    for g, w in zip(got, step(x, emb)):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)


# ----- switches --------------------------------------------------------------------------------
def test_each_pass_switched_off_gives_the_old_graph(backend):
    w, b = conv_params(4, 4)
    gn = layers.GroupNorm(2, 4)
    x, emb = tc.randn(1, 4, 4, 4), tc.randn(1, 4)
    fn = lambda x, emb: F.conv2d(F.silu(gn(x + emb[:, :, None, None])), w, b, padding=1) + x  # noqa: E731
    with tc.no_grad():
        for off in ("fuse_epilogue", "fuse_norm"):
            switches = {"fuse_elementwise": False, "fuse_norm_conv": False, off: False}
            compiled, _ = compiled_twice(fn, x, emb, passes=switches)
            done = compiled.plan_info()[0]["passes"]
            reference, _ = compiled_twice(fn, x, emb, passes={"fuse_elementwise": False, "fuse_epilogue": False,
                                                              "fuse_norm": False, "fuse_norm_conv": False})
            assert off not in done and len(done) == 1
            table, old = compiled.plan_info()[0]["graph"], reference.plan_info()[0]["graph"]
            if off == "fuse_epilogue":
                assert "residual=" not in table and table.count("binary(") == old.count("binary(") - 1
            else:
                assert "shift=" not in table and "residual=" in table
                assert table.count("group_norm(") == 1 and table.count("unary(") == 1


# ----- the backend ops against the NumPy reference ---------------------------------------------
def _numpy_reference(method: str, *args, **kwargs):
    with tc.use_backend("numpy"):
        be = tc.get_backend()
        return getattr(be, method)(*[be.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args],
                                   **{k: be.from_numpy(v) if isinstance(v, np.ndarray) else v
                                      for k, v in kwargs.items()})


@settings(max_examples=10)
@given(batch=st.lists(st.integers(1, 3), max_size=2), m=st.integers(1, 9), k=st.integers(1, 17),
       n=st.integers(1, 19), act=st.sampled_from(["none", *ACTS]), bias=st.booleans(),
       dtype=st.sampled_from(["float32", "float64"]), seed=st.integers(0, 2 ** 16))
def test_matmul_bias_act_equals_the_two_calls(backend, batch, m, k, n, act, bias, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((*batch, m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    c = rng.standard_normal(n).astype(dtype) if bias else None
    be = tc.get_backend()
    args = [None if v is None else be.from_numpy(v) for v in (a, b, c)]
    got = be.to_numpy(be.matmul_bias_act(*args, act))
    own = be.to_numpy(be.bias_act(be.matmul(args[0], args[1]), args[2], act, -1))
    np.testing.assert_array_equal(got, own)  # the backend's own two calls, bit for bit
    ref = _numpy_reference("bias_act", a @ b, c, act, -1)
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


@settings(max_examples=12)
@given(n=st.integers(1, 3), groups=st.integers(1, 3), per_group=st.integers(1, 3),
       spatial=st.lists(st.integers(1, 7), max_size=2), act=st.sampled_from(["none", "silu", "gelu"]),
       affine=st.booleans(), dtype=st.sampled_from(["float32", "float64"]), seed=st.integers(0, 2 ** 16))
def test_group_norm_shift_equals_the_add_first(backend, n, groups, per_group, spatial, act, affine, dtype, seed):
    rng = np.random.default_rng(seed)
    c = groups * per_group
    x = (rng.standard_normal((n, c, *spatial)) * 2 + 0.5).astype(dtype)
    shift = rng.standard_normal((n, c)).astype(dtype)
    w, b = (rng.standard_normal(c).astype(dtype) for _ in range(2)) if affine else (None, None)
    be = tc.get_backend()
    dev = [None if v is None else be.from_numpy(v) for v in (x, shift, w, b)]
    got = [be.to_numpy(r) for r in be.group_norm(dev[0], dev[2], dev[3], groups, 1e-5, act, shift=dev[1])]
    summed = be.binary("add", dev[0], dev[1].reshape((n, c) + (1,) * len(spatial)))
    own = [be.to_numpy(r) for r in be.group_norm(summed, dev[2], dev[3], groups, 1e-5, act)]
    for g, o in zip(got, own):
        np.testing.assert_array_equal(g, o)  # the add, then the same kernel
    shifted = x + shift.reshape((n, c) + (1,) * len(spatial))
    ref = _numpy_reference("group_norm", shifted, w, b, groups, 1e-5, act)
    tol = 2e-5 if dtype == "float32" else 1e-10
    # y = (v - mean) * rstd * w + b: a kernel's rounding of v or of its multiply-add is
    # amplified by rstd, up to 1/sqrt(eps) ~ 316 for a group of equal values (one element)
    scale = float(got[2].max()) * (1.0 if w is None else max(1.0, float(np.abs(w).max())))
    y_tol = max(tol, 8 * np.finfo(dtype).eps * (float(np.abs(shifted).max()) + 1.0) * scale)
    for g, r, t in zip(got, ref, (y_tol, tol, tol)):
        np.testing.assert_allclose(g, r, rtol=tol, atol=t)


def test_group_norm_shift_is_checked(backend):
    be = tc.get_backend()
    x = be.from_numpy(np.zeros((2, 4, 3), np.float32))
    for bad in (np.zeros((4,), np.float32), np.zeros((2, 4, 1), np.float32), np.zeros((2, 4), np.float64)):
        with pytest.raises(ValueError, match="group_norm: shift must be"):
            be.group_norm(x, None, None, 2, 1e-5, "none", shift=be.from_numpy(bad))
    with pytest.raises(ValueError, match="matmul_bias_act"):
        be.matmul_bias_act(be.from_numpy(np.zeros((2, 3), np.float32)), be.from_numpy(np.zeros((3, 4), np.float32)),
                           be.from_numpy(np.zeros(4, np.float32)), "swish")


# ----- a small UNet ----------------------------------------------------------------------------
def small_unet() -> diffusion.UNet2D:
    tc.manual_seed(0)
    return diffusion.UNet2D(sample_size=16, in_channels=3, out_channels=3, block_out_channels=(32, 64),
                            layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                            up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8).eval()


def test_unet_compiled_with_every_pass_equals_eager(backend):
    compiled = compiled_unet(small_unet(), tc.randn(2, 3, 16, 16), tc.tensor([10.0, 500.0]), backend)
    done = compiled.plan_info()[0]["passes"]
    assert done["fuse_epilogue"] > 0 and done["fuse_norm"] > 0 and done["fuse_norm_conv"] > 0
    table = compiled.plan_info()[0]["graph"]
    assert "residual=" in table and "group_norm_conv2d(" in table and "matmul_bias_act(" in table


def compiled_unet(model: diffusion.UNet2D, x: tc.Tensor, t: tc.Tensor, backend: str):
    """``model`` compiled and replayed on (x, t), its sample checked against eager's: bit
    for bit on the CPU, within float32 rounding on CuPy (its epilogues round in registers)."""
    with tc.no_grad():
        compiled, got = compiled_twice(model, x, t)
        want = model(x, t)
    got, want = (getattr(o, "sample", o) for o in (got, want))
    if backend == "cupy":
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
    else:
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    return compiled


@pytest.mark.parametrize("scale, folds", [(2.0, True), (1.5, False)])
def test_resnet_block_with_an_output_scale(backend, scale, folds):
    tc.manual_seed(3)
    block = ResnetBlock2D(4, 8, temb_channels=6, groups=2, output_scale_factor=scale).eval()
    x, temb = tc.randn(2, 4, 5, 5), tc.randn(2, 6)
    with tc.no_grad():
        compiled, got = compiled_twice(block, x, temb)
        want = block(x, temb)
    done = compiled.plan_info()[0]["passes"]
    assert done["fuse_norm"] == 1  # the time embedding into norm2 (the block passes act='silu' itself)
    assert done["fuse_epilogue"] == 2 + folds  # time_emb_proj's bias; conv2's residual (and scale)
    assert_matches(got, want, backend)


# ----- the GPU kernels ---------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("shape, groups", [((2, 64, 16, 16), 8), ((1, 32, 5, 7), 4), ((2, 256, 64, 64), 32)])
def test_every_cuda_group_norm_kernel_adds_the_shift_as_eager_does(shape, groups):
    from tensorcore.backends.cupy import groupnorm

    with tc.use_backend("cupy"):
        be = tc.get_backend()
        rng = np.random.default_rng(0)
        n, c = shape[:2]
        x = be.from_numpy((rng.standard_normal(shape) * 2 + 0.5).astype(np.float32))
        shift = be.from_numpy(rng.standard_normal((n, c)).astype(np.float32))
        w, b = (be.from_numpy(rng.standard_normal(c).astype(np.float32)) for _ in range(2))
        summed = be.binary("add", x, shift.reshape(n, c, 1, 1))
        s = x.size // (n * c)
        stat_len = c // groups * s
        runs = {
            "chosen": lambda x, sh: be.group_norm(x, w, b, groups, 1e-5, "silu", shift=sh),
            "two-pass": lambda x, sh: be._plane_forward(x, w, b, (n, groups), c // groups, False, 1e-5, "silu",
                                                        shift=sh),
            "cluster": lambda x, sh: groupnorm.clustered(x, sh, w, b, (n, groups), stat_len, s, 1e-5, "silu"),
            "resident": lambda x, sh: groupnorm._resident(x, sh, w, b, (n, groups), stat_len, s, 1e-5, "silu"),
        }
        for name, run in runs.items():
            if name in ("cluster", "resident") and s % 4:
                continue
            fused, eager = run(x, shift), run(summed, None)
            if fused is None:  # that one-pass kernel does not take this shape
                assert eager is None
                continue
            for f, e in zip(fused, eager):
                np.testing.assert_array_equal(be.to_numpy(f), be.to_numpy(e), err_msg=name)


@pytest.mark.gpu
def test_cuda_matmul_bias_act_runs_in_place_and_equals_the_two_calls():
    with tc.use_backend("cupy"):
        be = tc.get_backend()
        rng = np.random.default_rng(1)
        a, b = (be.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in ((4, 33, 64), (64, 48)))
        bias = be.from_numpy(rng.standard_normal(48).astype(np.float32))
        for act in ["none", *ACTS]:
            got = be.matmul_bias_act(a, b, bias, act)
            want = be.bias_act(be.matmul(a, b), bias, act, -1)
            np.testing.assert_array_equal(be.to_numpy(got), be.to_numpy(want))
