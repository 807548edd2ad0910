"""The pattern-rewrite passes of tc.compile: attention fusion and the LoRA rewrite.

Bounds: the fused calls may sum in another order than the eager chain, so compiled
results are compared with eager ones at rtol 1e-5 / atol 1e-6 in float32 and rtol
1e-12 in float64.  Where the fused call runs the eager chain's own kernels in the eager
order (the attention reference with the scale applied to the product; the LoRA
reference) the CPU results are checked bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import layers
import optim
import tensorcore as tc
import tensorcore.functional as F
from tensorcore.backends import load
from tensorcore.compile.passes import DEFAULT, resolve
from tensorcore.compile.passes.dce import dead_code_elimination
from tensorcore.compile.passes.fuse_attention import fuse_attention
from tensorcore.compile.passes.lora import lora
from test_compile_graph import ops, record

F32 = dict(rtol=1e-5, atol=1e-6)
F64 = dict(rtol=1e-12, atol=1e-14)


def compiled_twice(fn, *args, **options):
    """The compiled callable and its replayed result (the first call traces)."""
    compiled = tc.compile(fn, cache_dir=False, **options)
    compiled(*args)
    return compiled, compiled(*args)


def plan_ops(compiled) -> list[str]:
    """The calls of the (one) cached plan, in order."""
    (info,) = compiled.plan_info()
    return [line.split(" = ")[1].split("(")[0] for line in info["graph"].splitlines() if " = " in line]


def close(got: tc.Tensor, want: tc.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got.numpy(), want.numpy(), **(F64 if got.dtype == tc.float64 else F32))


def qkv(rank: int, dtype=tc.float32, lq: int = 5, lk: int = 6, d: int = 4, dv: int = 3):
    lead = (2, 3) if rank == 4 else (2,)
    rng = np.random.default_rng(rank)
    make = lambda *shape: tc.tensor(rng.standard_normal(lead + shape), dtype=dtype)  # noqa: E731
    return make(lq, d), make(lk, d), make(lk, dv)


# ----- attention fusion -------------------------------------------------------------------------
def _mask(lq: int = 5, lk: int = 6) -> tc.Tensor:
    return tc.tensor(np.triu(np.full((lq, lk), -np.inf), 1) + np.linspace(-1, 1, lq * lk).reshape(lq, lk),
                     dtype=tc.float32)


FORMS = {
    # name: (function of q, k, v, mask, bit for bit on the CPU)
    "scaled_product": (lambda q, k, v, m: F.softmax((q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1])), -1) @ v, True),
    "scalar_first": (lambda q, k, v, m: F.softmax(0.5 * (q @ k.transpose(-1, -2)), -1) @ v, True),
    "divided": (lambda q, k, v, m: F.softmax((q @ k.transpose(-1, -2)) / 3.0, -1) @ v, False),
    "scaled_q": (lambda q, k, v, m: F.softmax((q * 0.3) @ k.transpose(-1, -2), -1) @ v, False),
    "scaled_q_and_k": (lambda q, k, v, m: F.softmax((q * 0.7) @ (k * 0.6).transpose(-1, -2), -1) @ v, False),
    "masked": (lambda q, k, v, m: F.softmax((q @ k.transpose(-1, -2)) * 0.5 + m, -1) @ v, True),
    "mask_first": (lambda q, k, v, m: F.softmax(m + (q @ k.transpose(-1, -2)) * 0.5, -1) @ v, True),
    "unscaled": (lambda q, k, v, m: F.softmax(q @ k.transpose(-1, -2), -1) @ v, True),
}


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_attention_fusion_fires_and_matches_eager(backend, form, rank):
    fn, exact = FORMS[form]
    q, k, v = qkv(rank)
    m = _mask()
    compiled, got = compiled_twice(fn, q, k, v, m)
    assert plan_ops(compiled) == ["attention"]
    assert compiled.cache_info().rewrites["fuse_attention"] == 1
    want = fn(q, k, v, m)
    close(got, want)
    if exact and backend == "numpy":  # Numba's and CuPy's attention kernels add in their own order
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_attention_fusion_takes_k_stored_transposed_and_float64(backend):
    def fn(q, kt, v):
        return F.softmax((q @ kt) * 0.25, -1) @ v

    q, k, v = qkv(4, tc.float64)
    kt = tc.tensor(np.ascontiguousarray(k.numpy().swapaxes(-1, -2)))
    compiled, got = compiled_twice(fn, q, kt, v)
    assert plan_ops(compiled) == ["attention"]
    close(got, fn(q, kt, v))


def test_attention_fusion_inside_a_module_replays_new_inputs(backend):
    class HandAttention(layers.Module):
        def __init__(self) -> None:
            super().__init__()
            self.to_q, self.to_k, self.to_v = layers.Linear(8, 8), layers.Linear(8, 8), layers.Linear(8, 8)

        def forward(self, x: tc.Tensor) -> tc.Tensor:
            b, n, _ = x.shape
            q, k, v = (f(x).reshape(b, n, 2, 4).permute(0, 2, 1, 3) for f in (self.to_q, self.to_k, self.to_v))
            out = F.softmax((q @ k.transpose(-1, -2)) * 0.5, -1) @ v
            return out.permute(0, 2, 1, 3).reshape(b, n, 8)

    tc.manual_seed(3)
    model = HandAttention()
    compiled = tc.compile(model, cache_dir=False)
    with tc.no_grad():
        for _ in range(3):
            x = tc.randn(2, 5, 8)
            close(compiled(x), model(x))
    assert "attention" in plan_ops(compiled) and compiled.cache_info().hits == 2


def test_attention_fusion_fires_on_multihead_attention_whose_weights_go_unused(backend):
    tc.manual_seed(2)
    mha = layers.MultiHeadAttention(8, 2, batch_first=True).eval()
    out_only = lambda x: mha(x, x, x)[0]  # noqa: E731  (the averaged weights are dead code)
    both = lambda x: mha(x, x, x)  # noqa: E731  (the weights read the probabilities)
    x = tc.randn(2, 5, 8)
    with tc.no_grad():
        fused, got = compiled_twice(out_only, x)
        kept, _ = compiled_twice(both, x)
        want = out_only(x)
    assert "attention" in plan_ops(fused) and "attention" not in plan_ops(kept)
    close(got, want)


def _probs_returned(q, k, v):
    p = F.softmax((q @ k.transpose(-1, -2)) * 0.5, -1)
    return p @ v, p


def _scores_read_twice(q, k, v):
    s = (q @ k.transpose(-1, -2)) * 0.5
    return F.softmax(s, -1) @ v + s.sum()


SCALES: dict[str, tc.Tensor] = {}  # per device; bound by reference: the value may change between calls


def _tensor_scale(q, k, v):
    scale = SCALES.setdefault(q.device, tc.tensor(0.5, device=q.device))
    return F.softmax((q @ k.transpose(-1, -2)) * scale, -1) @ v


def _per_key_scale(q, k, v):
    return F.softmax((q @ k.transpose(-1, -2)) * tc.linspace(0.5, 1.0, k.shape[-2]), -1) @ v


def _mask_scaled_after(q, k, v):
    return F.softmax(((q @ k.transpose(-1, -2)) + tc.ones(5, 6)) * 0.5, -1) @ v


def _softmax_other_axis(q, k, v):
    return F.softmax((q @ k.transpose(-1, -2)) * 0.5, -2) @ tc.ones(6, 6)


def _q_written_between(q, k, v):
    s = q @ k.transpose(-1, -2)
    q.mul_(2.0)  # the fused call would read the new q
    return F.softmax(s, -1) @ v


@pytest.mark.parametrize("fn", [_probs_returned, _scores_read_twice, _tensor_scale, _per_key_scale,
                                _mask_scaled_after, _softmax_other_axis, _q_written_between])
def test_attention_fusion_leaves_chains_it_must_not_fuse(backend, fn):
    q, k, v = qkv(3)
    fresh = lambda: tc.tensor(q.numpy())  # noqa: E731  (one function writes its q)
    compiled = tc.compile(fn, cache_dir=False)
    compiled(fresh(), k, v)
    got = compiled(fresh(), k, v)
    assert "attention" not in plan_ops(compiled) and "fuse_attention" not in compiled.cache_info().rewrites
    want = fn(fresh(), k, v)
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_attention_fusion_never_fires_in_a_training_graph(backend):
    tc.manual_seed(0)
    proj = layers.Linear(4, 4)
    opt = optim.SGD(proj.parameters(), lr=0.1)

    def step(q, k, v):
        opt.zero_grad(set_to_none=False)
        out = F.softmax((proj(q) @ k.transpose(-1, -2)) * 0.5, -1) @ v
        loss = (out * out).mean()
        loss.backward()  # the softmax backward reads the probabilities
        opt.step()
        return loss

    q, k, v = qkv(3)
    compiled = tc.compile(step, cache_dir=False)
    for _ in range(3):
        compiled(q, k, v)
    assert "softmax" in plan_ops(compiled) and "attention" not in plan_ops(compiled)
    assert "fuse_attention" not in compiled.cache_info().rewrites


def test_attention_fusion_switched_off_leaves_the_graph(backend):
    fn = FORMS["masked"][0]
    q, k, v = qkv(4)
    m = _mask()
    off, got = compiled_twice(fn, q, k, v, m, passes={"fuse_attention": False})
    without, _ = compiled_twice(fn, q, k, v, m, passes=[name for name in DEFAULT if name != "fuse_attention"])
    assert off.plan_info()[0]["graph"] == without.plan_info()[0]["graph"]
    assert "softmax" in plan_ops(off) and "fuse_attention" not in off.cache_info().rewrites
    np.testing.assert_array_equal(got.numpy(), fn(q, k, v, m).numpy())
    graph = dead_code_elimination(record(FORMS["masked"][0], q, k, v, m))
    fused = fuse_attention(graph)
    assert ops(fused) == ["attention"] and fused.stats == {"fuse_attention": 1}
    plain = record(_probs_returned, q, k, v)
    assert fuse_attention(plain) is plain  # nothing to do: the very same graph
    assert "fuse_attention" in DEFAULT and DEFAULT.index("fuse_attention") < DEFAULT.index("fuse_elementwise")


def test_fused_attention_plan_survives_the_disk_cache(backend, tmp_path):
    fn = FORMS["masked"][0]
    q, k, v = qkv(3)
    m = _mask()
    tc.compile(fn, cache_dir=tmp_path)(q, k, v, m)
    loaded = tc.compile(fn, cache_dir=tmp_path)
    got = loaded(q, k, v, m)
    assert loaded.cache_info().disk_loads == 1 and plan_ops(loaded) == ["attention"]
    close(got, fn(q, k, v, m))


# ----- the LoRA rewrite --------------------------------------------------------------------------
def _lora_layer(bias: bool = True, rank: int = 2, dtype=tc.float32) -> layers.LoRALinear:
    tc.manual_seed(5)
    layer = layers.LoRALinear(layers.Linear(6, 5, bias=bias, dtype=dtype), rank=rank, alpha=3.0)
    with tc.no_grad():
        layer.lora_B.copy_(tc.randn(rank, 5, dtype=dtype))  # B starts at zero: make the update count
    return layer


class _Small(layers.Module):
    """Linear -> SiLU -> LoRALinear -> Tanh."""

    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.inp, self.act, self.adapted, self.out = layers.Linear(4, 6), layers.SiLU(), _lora_layer(bias), layers.Tanh()

    def forward(self, x: tc.Tensor) -> tc.Tensor:
        return self.out(self.adapted(self.act(self.inp(x))))


@pytest.mark.parametrize("shape", [(4,), (3, 4), (2, 3, 4)])
@pytest.mark.parametrize("bias", [True, False])
def test_lora_rewrite_in_a_small_model_matches_eager_and_is_counted(backend, bias, shape):
    model = _Small(bias).eval()
    compiled = tc.compile(model, cache_dir=False)
    rng = np.random.default_rng(1)
    with tc.no_grad():
        for _ in range(3):
            x = tc.tensor(rng.standard_normal(shape), dtype=tc.float32)
            close(compiled(x), model(x))
    info = compiled.cache_info()
    assert info.rewrites["lora"] == 1 and info.traces == 1 and info.hits == 2
    assert plan_ops(compiled).count("lora_linear") == 1 and _products(compiled) == 1  # the first Linear's


def _products(compiled) -> int:
    """GEMM calls in the plan: plain, with their bias folded in by epilogue fusion, or
    grouped with others of the same input."""
    found = plan_ops(compiled)
    grouped = compiled.plan_info()[0]["passes"].get("group_linear", 0)
    return found.count("matmul") + found.count("matmul_bias_act") + grouped


def test_lora_rewrite_float64_and_the_reference_bit_for_bit(backend):
    layer = _lora_layer(dtype=tc.float64)
    x = tc.randn(3, 6, dtype=tc.float64)
    with tc.no_grad():
        compiled, got = compiled_twice(layer, x)
        want = layer(x)
    assert plan_ops(compiled) == ["lora_linear"]
    close(got, want)
    if backend == "numpy":
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_lora_model_recompiles_after_merge_without_the_rewrite(backend):
    model = _Small().eval()
    compiled = tc.compile(model, cache_dir=False)
    x = tc.randn(3, 4)
    with tc.no_grad():
        compiled(x), compiled(x)
        before = model.structure_version
        model.adapted.merge()
        assert model.structure_version != before
        got = compiled(x)
        np.testing.assert_array_equal(got.numpy(), model(x).numpy())  # the merged forward is the base alone
    info = compiled.cache_info()
    assert info.traces == 2 and info.plans == 2
    merged = compiled.plan_info()[-1]
    assert "lora_linear" not in merged["graph"] and "lora" not in merged["passes"]


def _xa_returned(layer):
    def fn(x):
        xa = x @ layer.lora_A
        return layer.base(x) + (xa @ layer.lora_B) * layer.scale, xa
    return fn


def _tensor_scale_lora(layer):
    return lambda x: layer.base(x) + ((x @ layer.lora_A) @ layer.lora_B) * tc.tensor(layer.scale)


def _other_input(layer):
    return lambda x: layer.base(x) + ((x * 2.0 @ layer.lora_A) @ layer.lora_B) * layer.scale


def _activated_base(layer):
    return lambda x: F.silu(layer.base(x)) + ((x @ layer.lora_A) @ layer.lora_B) * layer.scale


def _broadcast_add(layer):
    return lambda x: layer.base(x)[:1] + ((x @ layer.lora_A) @ layer.lora_B) * layer.scale


@pytest.mark.parametrize("make", [_xa_returned, _tensor_scale_lora, _other_input, _activated_base, _broadcast_add])
def test_lora_rewrite_leaves_chains_it_must_not_fuse(backend, make):
    layer = _lora_layer()
    fn = make(layer)
    x = tc.randn(3, 6)
    with tc.no_grad():
        compiled, got = compiled_twice(fn, x)
        want = fn(x)
    assert "lora_linear" not in plan_ops(compiled) and "lora" not in compiled.cache_info().rewrites
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_lora_rewrite_never_fires_in_a_training_graph(backend):
    layer = _lora_layer()
    twin = _lora_layer()

    def trainer(model):
        opt = optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)

        def step(x):
            opt.zero_grad(set_to_none=False)
            loss = (model(x) ** 2).mean()
            loss.backward()  # B's gradient reads x @ A
            opt.step()
            return loss
        return step

    compiled = tc.compile(trainer(layer), cache_dir=False)
    eager = trainer(twin)
    x = tc.randn(3, 6)
    for _ in range(3):
        np.testing.assert_array_equal(compiled(x).numpy(), eager(x).numpy())
    assert "lora_linear" not in plan_ops(compiled) and "lora" not in compiled.cache_info().rewrites


def test_lora_rewrite_switched_off_leaves_the_graph(backend):
    layer = _lora_layer()
    x = tc.randn(3, 6)
    with tc.no_grad():
        off, got = compiled_twice(layer, x, passes={"lora": False})
        without, _ = compiled_twice(layer, x, passes=[name for name in DEFAULT if name != "lora"])
        np.testing.assert_array_equal(got.numpy(), layer(x).numpy())
    assert off.plan_info()[0]["graph"] == without.plan_info()[0]["graph"]
    assert _products(off) == 3 and "lora_linear" not in plan_ops(off)
    assert "lora" not in off.cache_info().rewrites
    assert resolve({"lora": False}) == tuple(resolve([n for n in DEFAULT if n != "lora"]))
    with tc.no_grad():
        graph = dead_code_elimination(record(layer, x))
        plain = record(_activated_base(layer), x)
    assert ops(lora(graph)) == ["lora_linear"] and lora(graph).stats == {"lora": 1}
    assert lora(plain) is plain


def test_lora_plan_survives_the_disk_cache(backend, tmp_path):
    layer = _lora_layer()
    x = tc.randn(2, 6)
    with tc.no_grad():
        tc.compile(layer, cache_dir=tmp_path)(x)
        loaded = tc.compile(layer, cache_dir=tmp_path)
        got = loaded(x)
        close(got, layer(x))
    assert loaded.cache_info().disk_loads == 1 and plan_ops(loaded) == ["lora_linear"]


# ----- the lora_linear backend op ------------------------------------------------------------------
@st.composite
def lora_calls(draw):
    lead = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
    k, n, r = draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.integers(1, 16))
    return dict(lead=lead, k=k, n=n, r=r, bias=draw(st.booleans()), transposed=draw(st.booleans()),
                dtype=draw(st.sampled_from(["float32", "float64"])), scale=draw(st.floats(-4, 4, width=32)),
                seed=draw(st.integers(0, 2 ** 16)))


def _operands(call: dict, xp=np):
    rng = np.random.default_rng(call["seed"])
    dt = call["dtype"]
    x = rng.standard_normal(call["lead"] + (call["k"],)).astype(dt)
    weight = rng.standard_normal((call["n"], call["k"])).astype(dt)
    weight_t = weight.T if call["transposed"] else np.ascontiguousarray(weight.T)
    bias = rng.standard_normal(call["n"]).astype(dt) if call["bias"] else None
    a = rng.standard_normal((call["k"], call["r"])).astype(dt)
    b = rng.standard_normal((call["r"], call["n"])).astype(dt)
    return [x, weight_t, bias, a, b]


@settings(max_examples=12)
@given(call=lora_calls())
def test_lora_linear_matches_the_reference_and_float64(backend, call):
    ops_ = _operands(call)
    device = tc.get_backend()
    want = load("numpy").lora_linear(*ops_, call["scale"])
    wide = [None if a is None else a.astype(np.float64) for a in ops_]
    exact = wide[0] @ wide[1] + (0 if wide[2] is None else wide[2]) + (wide[0] @ wide[3]) @ wide[4] * call["scale"]
    got = device.to_numpy(device.lora_linear(*[None if a is None else device.from_numpy(a) for a in ops_],
                                             call["scale"]))
    assert got.shape == call["lead"] + (call["n"],) and got.dtype == ops_[0].dtype
    bound = dict(rtol=1e-5, atol=1e-5 * call["k"] * call["r"]) if call["dtype"] == "float32" else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, want, **bound)
    np.testing.assert_allclose(got, exact, **bound)


def test_lora_linear_writes_into_out_and_checks_its_arguments(backend):
    device = tc.get_backend()
    call = dict(lead=(2, 3), k=5, n=4, r=2, bias=True, transposed=True, dtype="float32", scale=0.5, seed=0)
    ops_ = [device.from_numpy(a) for a in _operands(call)]
    out = device.from_numpy(np.zeros((2, 3, 4), np.float32))
    result = device.lora_linear(*ops_, 0.5, out=out)
    assert result is out
    np.testing.assert_allclose(device.to_numpy(out), device.to_numpy(device.lora_linear(*ops_, 0.5)), **F32)
    x, weight_t, bias, a, b = ops_
    with pytest.raises(ValueError, match=r"lora_linear: expected x \[..., in\].*lora_b \(3, 4\)"):
        device.lora_linear(x, weight_t, bias, a, device.from_numpy(np.zeros((3, 4), np.float32)), 0.5)
    with pytest.raises(ValueError, match="lora_linear: expected.*bias \\(5,\\)"):
        device.lora_linear(x, weight_t, device.from_numpy(np.zeros(5, np.float32)), a, b, 0.5)
    with pytest.raises(TypeError, match="lora_linear: .*one float dtype.*float64"):
        device.lora_linear(x, weight_t, bias, device.from_numpy(np.zeros((5, 2))), b, 0.5)
    with pytest.raises(ValueError, match=r"lora_linear: out must be a float32 array of shape \(2, 3, 4\)"):
        device.lora_linear(*ops_, 0.5, out=device.from_numpy(np.zeros((6, 4), np.float32)))


def test_lora_linear_large_call_runs_the_parallel_numba_loop():
    call = dict(lead=(700,), k=16, n=96, r=4, bias=True, transposed=True, dtype="float32", scale=0.75, seed=2)
    ops_ = _operands(call)  # 67200 output elements: above the serial threshold
    got = load("numba").lora_linear(*ops_, 0.75)
    np.testing.assert_allclose(got, load("numpy").lora_linear(*ops_, 0.75), rtol=1e-5, atol=1e-5)
