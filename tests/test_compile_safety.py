"""The safety rules of tc.compile, one test each: outputs are not aliased, random ops
advance, host reads refuse or fall back, a failing replay falls back, threads are safe,
keys and guards retrace when the program changes, memory stays flat, plans are freed."""

from __future__ import annotations

import threading
import tracemalloc
import warnings

import numpy as np
import pytest

import layers
import tensorcore as tc
import tensorcore.functional as F
from tensorcore import random
from tensorcore.backends.numpy.executor import CpuReplay
from tensorcore.compile import host


def _same(a: tc.Tensor, b: tc.Tensor) -> bool:
    return a.shape == b.shape and np.array_equal(a.numpy(), b.numpy())


def _mlp() -> layers.Sequential:
    tc.manual_seed(0)
    return layers.Sequential(layers.Linear(4, 8), layers.SiLU(), layers.Linear(8, 3))


def _executor_type(backend: str) -> type:
    if backend == "cupy":
        from tensorcore.backends.cupy.executor import CudaGraphReplay  # imports CuPy

        return CudaGraphReplay
    return CpuReplay


# ----- outputs ---------------------------------------------------------------------------
def test_outputs_are_not_aliased_by_the_next_replay(backend):
    f = lambda x: tc.tanh(x) * 2  # noqa: E731
    compiled = tc.compile(f, cache_dir=False)
    xs = [tc.randn(3, 4) for _ in range(4)]
    outs = [compiled(x) for x in xs]
    for x, y in zip(xs, outs):
        assert _same(y, f(x))
    assert len({id(y.data) for y in outs}) == len(outs)


def test_reuse_outputs_returns_the_plans_buffer(backend):
    compiled = tc.compile(lambda x: x + 1, cache_dir=False, reuse_outputs=True)
    compiled(tc.zeros(3))  # trace
    first = compiled(tc.zeros(3))
    second = compiled(tc.ones(3))
    assert np.array_equal(first.numpy(), [2, 2, 2])  # overwritten by the next replay, as documented
    assert np.array_equal(second.numpy(), [2, 2, 2])


def test_inputs_written_in_place_are_written_back(backend):
    def f(x, y):
        with tc.no_grad():
            x.add_(y)
        return x * 2

    compiled = tc.compile(f, cache_dir=False)
    for i in range(3):
        x, y = tc.zeros(3), tc.full((3,), float(i + 1))
        out = compiled(x, y)
        assert np.array_equal(x.numpy(), [i + 1] * 3) and np.array_equal(out.numpy(), [2 * (i + 1)] * 3)


# ----- random ops ------------------------------------------------------------------------
def test_random_ops_advance_on_every_replay(backend):
    f = lambda x: F.dropout(x, 0.5) + tc.randn(*x.shape)  # noqa: E731
    compiled = tc.compile(f, cache_dir=False)
    x = tc.ones(64)
    tc.manual_seed(11)
    got = [compiled(x).numpy() for _ in range(4)]
    tc.manual_seed(11)
    want = [f(x).numpy() for _ in range(4)]
    assert compiled.cache_info().hits >= 2
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
    assert not np.array_equal(got[1], got[2])


def test_reseeding_retraces_and_matches_eager(backend):
    compiled = tc.compile(lambda x: x * tc.rand(*x.shape), cache_dir=False)
    x = tc.ones(8)
    compiled(x), compiled(x)
    tc.manual_seed(3)
    got = compiled(x).numpy()
    tc.manual_seed(3)
    assert np.array_equal(got, (x * tc.rand(8)).numpy())


def test_a_generator_seeded_in_the_call_runs_eagerly(backend):
    def f(x):
        generator = tc.Generator(x.device, seed=3)  # reseeded on every call: a replay could not
        return x + tc.rand(*x.shape, device=x.device, generator=generator)

    compiled = tc.compile(f, cache_dir=False)
    with pytest.warns(tc.compile.CompileWarning, match="seeded a random generator"):
        for _ in range(host.SETTLE_ATTEMPTS + 1):
            x = tc.randn(4)
            assert _same(compiled(x), f(x))


def test_a_default_generator_made_in_the_call_settles(backend, monkeypatch):
    device = tc.get_backend().device
    monkeypatch.delitem(random._default, device, raising=False)  # made on first use, inside the trace
    compiled = tc.compile(lambda x: F.dropout(x, 0.5), cache_dir=False)
    x = tc.ones(32)
    got = [compiled(x).numpy() for _ in range(3)]
    monkeypatch.delitem(random._default, device)
    want = [F.dropout(x, 0.5).numpy() for _ in range(3)]
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    info = compiled.cache_info()
    assert info.unsettled == 1 and info.hits == 1


# ----- host reads ------------------------------------------------------------------------
@pytest.mark.parametrize("read, name", [
    (lambda t: t.sum().item(), "Tensor.item()"),
    (lambda t: t.numpy(), "Tensor.numpy()"),
    (lambda t: 1 if t.sum() > 0 else 0, "bool(tensor)"),
    (lambda t: float(t.mean()), "float(tensor)"),
    (lambda t: np.asarray(t), "numpy.asarray(tensor)"),
    (lambda t: t.tolist(), "Tensor.tolist()"),
])
def test_host_read_while_tracing_raises_a_trace_error(backend, read, name):
    def f(x):
        read(x * 2)
        return x + 1

    compiled = tc.compile(f, cache_dir=False)
    with pytest.raises(tc.compile.TraceError, match=name.replace("(", r"\(").replace(")", r"\)")):
        compiled(tc.randn(3))
    assert compiled.cache_info().plans == 0


def test_host_read_with_eager_fallback_warns_once_and_runs_eagerly(backend):
    def f(x):
        scale = float(x.abs().max())  # data-dependent
        return x / scale

    compiled = tc.compile(f, cache_dir=False, fallback="eager")
    x = tc.randn(5)
    with pytest.warns(tc.compile.CompileWarning, match="float"):
        assert _same(compiled(x), f(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            x = tc.randn(5)
            assert _same(compiled(x), f(x))
    info = compiled.cache_info()
    assert info.eager_only == 1 and info.plans == 0 and info.fallbacks >= 3 and info.traces == 0


def test_reading_a_constant_while_tracing_is_allowed(backend):
    def f(x):
        n = int(tc.tensor(3).item())  # a constant: no data dependence
        return x * n

    compiled = tc.compile(f, cache_dir=False)
    for _ in range(2):
        x = tc.randn(2)
        assert _same(compiled(x), x * 3)
    assert compiled.cache_info().hits == 1


# ----- failures ----------------------------------------------------------------------------
def test_failing_replay_falls_back_to_eager_with_one_warning(backend, monkeypatch):
    model = _mlp()
    compiled = tc.compile(model, cache_dir=False)
    x = tc.randn(2, 4)
    compiled(x)

    def broken(self, arrays, fresh=True):
        raise RuntimeError("device lost")

    monkeypatch.setattr(_executor_type(backend), "run", broken)
    with pytest.warns(tc.compile.CompileWarning, match="device lost"):
        assert _same(compiled(x), model(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _same(compiled(x), model(x))
    info = compiled.cache_info()
    assert info.eager_only == 1 and info.plans == 0


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="max_plans"):
        tc.compile(lambda x: x, max_plans=0)
    with pytest.raises(ValueError, match="fallback"):
        tc.compile(lambda x: x, fallback="skip")
    with pytest.raises(ValueError, match="unknown pass"):
        tc.compile(lambda x: x, passes=["fuse_everything"])
    with pytest.raises(TypeError, match="hashable"):
        tc.compile(lambda x, y: x, cache_dir=False)(tc.ones(1), [np.ones(2)])
    with pytest.raises(tc.compile.TraceError, match="returned a object"):
        tc.compile(lambda x: object(), cache_dir=False)(tc.ones(1))


def test_state_created_on_every_call_settles_to_eager(backend):
    class Keeps(layers.Module):
        def forward(self, x):
            self.last = x * 2  # a tensor kept after the call: no plan can reproduce that
            return self.last + 1

    model = Keeps()
    compiled = tc.compile(model, cache_dir=False)
    with pytest.warns(tc.compile.CompileWarning, match="still held"):
        for _ in range(host.SETTLE_ATTEMPTS + 2):
            x = tc.randn(3)
            assert _same(compiled(x), x * 2 + 1) and _same(model.last, x * 2)
    assert compiled.cache_info().eager_only == 1


def test_lazily_created_state_settles_after_one_retrace(backend):
    class Lazy(layers.Module):
        def forward(self, x):
            if not hasattr(self, "table"):
                self.table = tc.arange(0, x.shape[0], 1, dtype=x.dtype)
            return x * self.table

    model = Lazy()
    compiled = tc.compile(model, cache_dir=False)
    for _ in range(4):
        x = tc.randn(5)
        assert _same(compiled(x), x * model.table)
    info = compiled.cache_info()
    assert info.traces == 2 and info.unsettled == 1 and info.hits == 2


def test_rebinding_state_in_the_call_never_settles(backend):
    state = {"h": tc.zeros(3)}

    def step(x):
        state["h"] = state["h"] * 0.5 + x
        return state["h"] * 1

    compiled = tc.compile(step, cache_dir=False)
    h = np.zeros(3, np.float32)
    with pytest.warns(tc.compile.CompileWarning, match="replaced"):
        for i in range(host.SETTLE_ATTEMPTS + 2):
            h = h * 0.5 + i
            assert np.array_equal(compiled(tc.full((3,), float(i))).numpy(), h)


# ----- keys and guards ---------------------------------------------------------------------
def test_parameter_values_change_without_retrace(backend):
    model = _mlp()
    compiled = tc.compile(model, cache_dir=False)
    x = tc.randn(2, 4)
    compiled(x)
    with tc.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    assert _same(compiled(x), model(x))
    assert compiled.cache_info().traces == 1


@pytest.mark.parametrize("change", ["add_layer", "replace_parameter", "rebind_data", "train_mode", "training_attribute",
                                    "precision", "requires_grad", "requires_grad_attribute", "lora_merge"])
def test_program_changes_retrace(backend, change):
    tc.manual_seed(0)
    lora = layers.LoRALinear(layers.Linear(4, 4), rank=2)
    with tc.no_grad():
        lora.lora_B.fill_(0.25)
    model = layers.Sequential(layers.Linear(4, 4), layers.Dropout(0.5), lora)
    model.eval()
    compiled = tc.compile(model, cache_dir=False)
    x = tc.randn(3, 4)
    compiled(x), compiled(x)
    if change == "add_layer":
        model.append(layers.Tanh())
    elif change == "replace_parameter":
        model[0].bias = layers.Parameter(tc.ones(4))
    elif change == "rebind_data":
        model[0].weight.data = model[0].weight.data * 2
    elif change == "train_mode":
        model[1].train()
    elif change == "training_attribute":
        model[1].training = True
    elif change == "precision":
        tc.set_matmul_precision("high")
    elif change == "requires_grad":
        model[0].weight.requires_grad_(False)
    elif change == "requires_grad_attribute":
        model[0].weight.requires_grad = False
    else:
        lora.merge()
    try:
        tc.manual_seed(4)
        got = compiled(x)
        tc.manual_seed(4)
        assert _same(got, model(x))
    finally:
        tc.set_matmul_precision("highest")
    assert compiled.cache_info().traces == 2


def test_a_mode_round_trip_replays_the_first_plan(backend):
    model = layers.Sequential(layers.Linear(4, 4), layers.Dropout(0.5)).eval()
    compiled = tc.compile(model, cache_dir=False)
    x = tc.randn(3, 4)
    compiled(x)
    model.train()
    model.eval()
    model[1].training = True
    model[1].training = False
    assert _same(compiled(x), model(x))
    assert compiled.cache_info().traces == 1


def test_rebinding_a_buffer_is_noticed(backend):
    model = layers.BatchNorm2d(3).eval()
    compiled = tc.compile(model, cache_dir=False)
    x = tc.randn(2, 3, 4, 4)
    compiled(x), compiled(x)
    model.running_mean.data = model.running_mean.data + 1.0  # a plain tensor: no announcement
    assert _same(compiled(x), model(x))
    assert compiled.cache_info().traces == 2


def test_lru_keeps_at_most_max_plans(backend):
    compiled = tc.compile(lambda x: x * 2, cache_dir=False, max_plans=2)
    for n in (1, 2, 3, 1):
        compiled(tc.ones(n))
    info = compiled.cache_info()
    assert info.plans == 2 and info.traces == 4 and info.max_plans == 2


def test_lru_order_survives_its_shortcut_for_the_last_key():
    """The LRU answers a repeat of its newest key without a lookup; the order of the
    others, replacement, removal and clearing behave as without the shortcut."""
    from tensorcore.compile.lru import LRU

    lru: LRU[str] = LRU(2)
    assert lru.put(("a", (1,)), "A") == [] and lru.put(("b", (2,)), "B") == []
    assert lru.get(("a", (1,))) == "A"  # a fresh, equal key: "a" is now the newest
    assert lru.get(("a", (1,))) == "A"  # answered by the shortcut
    assert lru.put(("c", (3,)), "C") == ["B"]  # the least recent goes
    assert lru.get(("c", (3,))) == "C" and lru.get(("b", (2,))) is None
    assert lru.put(("c", (3,)), "C2") == ["C"] and lru.get(("c", (3,))) == "C2"
    assert lru.pop(("c", (3,))) == "C2" and lru.get(("c", (3,))) is None
    assert lru.get(("a", (1,))) == "A"
    lru.clear()
    assert lru.get(("a", (1,))) is None and len(lru) == 0


def test_the_last_calls_spec_is_reused_only_for_what_cannot_have_changed(backend):
    """A call repeating the last one's static arguments reuses its spec; a list changed in
    place, a tuple of equal but differently typed values, tensors of another shape or
    nested in a new tuple, a module put where a value was: each gets the key a fresh
    build gives, so the traces and results are those of an uncached key."""
    from tensorcore.compile.key import LastSpec, call_key

    def f(x, scale, options, pair, extra):
        out = x * scale * options[0] + pair[0] * pair[1]
        return out + sum(t.sum() for t in extra) if extra else out

    compiled = tc.compile(f, cache_dir=False)
    options, pair, x = [1.0], (2, 3), tc.randn(3)
    calls = [(x, 2.0, options, pair, ()), (tc.randn(3), 2.0, options, pair, ())]
    for args in calls:
        assert _same(compiled(*args), f(*args))
    assert compiled.cache_info().traces == 1 and compiled.cache_info().hits == 1
    options[0] = 5.0  # the same list, new contents
    assert _same(compiled(x, 2.0, options, pair, ()), f(x, 2.0, options, pair, ()))
    assert compiled.cache_info().traces == 2
    for args in [(x, 2.0, options, (True, 3), ()),  # equal to (1, 3)'s values, other types
                 (tc.randn(4), 2.0, options, pair, ()),
                 (x, 2.0, options, pair, (tc.randn(2),)),
                 (x, 2.0, options, pair, (tc.randn(5),))]:
        assert _same(compiled(*args), f(*args))
    assert compiled.cache_info().traces == 6

    last, module = LastSpec(), layers.Linear(2, 2)
    scale = float(np.float32(0.25) * 8)  # 2.0 computed anew: another object, the same spec
    assert last.check((x, 2.0, options, pair, ()))[0].spec is last.check((x, scale, options, pair, ()))[0].spec
    equal_pair = tuple([2, 3])  # a new tuple of equal values of the same types: the same spec
    assert equal_pair is not pair and last.check((x, scale, options, equal_pair, ()))[0].spec is \
        last.check((x, 2.0, options, pair, ()))[0].spec
    assert last.check((x, 2.0, options, (2.0, 3), ()))[0].spec != last.check((x, 2.0, options, pair, ()))[0].spec
    for args in [(x, 2.0, options, pair, (x, x)), (x, 2.0, options, pair, (x, x)), (x, 3.0, options, pair, ()),
                 (x, 3.0, module, pair, ()), (x, 3.0, layers.Linear(3, 3), pair, ()), (x, module, options, pair, ())]:
        layout, tensors = last.check(args)
        (fixed, _), fresh_tensors, fresh_stable = call_key(args, {}, [], None)
        assert layout.spec == fixed[0] and list(map(id, tensors)) == list(map(id, fresh_tensors))
        assert layout.stable == (fresh_stable is not None)
        assert layout.modules == [i for i, a in enumerate(args) if isinstance(a, layers.Module)]


def test_compiled_functions_nest(backend):
    inner = tc.compile(lambda x: x * 3, cache_dir=False)
    outer = tc.compile(lambda x: inner(x) + inner(x * 2), cache_dir=False)
    for _ in range(3):
        x = tc.randn(4)
        assert _same(outer(x), x * 3 + x * 2 * 3)
    assert outer.cache_info().hits == 2 and inner.cache_info().traces == 0


def test_decorator_forms(backend):
    @tc.compile
    def plain(x):
        return x + 1

    @tc.compile(max_plans=3, cache_dir=False)
    def configured(x):
        return x - 1

    x = tc.ones(2)
    assert _same(plain(x), x + 1) and _same(configured(x), x - 1)
    assert plain.__name__ == "plain" and configured.cache_info().max_plans == 3


def test_compiled_method_binds_its_module(backend):
    class Net(layers.Module):
        def __init__(self, scale: float) -> None:
            super().__init__()
            self.fc, self.scale = layers.Linear(3, 2), scale

        @tc.compile(cache_dir=False)
        def forward(self, x):
            return self.fc(x) * self.scale

    a, b = Net(2.0), Net(3.0)
    x = tc.randn(4, 3)
    for _ in range(2):
        assert _same(a(x), a.fc(x) * 2.0) and _same(b(x), b.fc(x) * 3.0)
    a.fc = layers.Linear(3, 2)  # a new structure: retraced
    assert _same(a(x), a.fc(x) * 2.0)
    assert Net.forward.cache_info().traces == 3


# ----- threads -----------------------------------------------------------------------------
def test_threads_hammering_one_compiled_callable(backend):
    model = _mlp()
    compiled = tc.compile(model, cache_dir=False)
    rng = np.random.default_rng(0)
    inputs = [tc.tensor(rng.standard_normal((1 + i % 3, 4)).astype(np.float32)) for i in range(8)]
    with tc.no_grad():
        want = [model(x).numpy() for x in inputs]
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        try:
            barrier.wait()
            with tc.no_grad():
                for j in range(25):
                    k = (i + j) % 8
                    assert np.array_equal(compiled(inputs[k]).numpy(), want[k])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors[0]
    info = compiled.cache_info()
    assert info.traces == 3 and info.plans == 3 and info.eager_only == 0  # one trace per key
    assert info.hits + info.misses == 8 * 25


# ----- memory --------------------------------------------------------------------------------
def test_no_memory_growth_over_1000_replays():
    """Host memory (NumPy backend: tracemalloc makes Numba calls very slow; the GPU test
    checks the device pool)."""
    with tc.use_backend("numpy"):
        model = _mlp()
        compiled = tc.compile(model, cache_dir=False, reuse_outputs=True)
        x = tc.randn(2, 4)
    with tc.use_backend("numpy"), tc.no_grad():
        tracemalloc.start()
        try:
            for _ in range(2000):  # fills Python's and NumPy's free lists while they are traced
                compiled(x)
            base = tracemalloc.get_traced_memory()[0]
            for _ in range(1000):
                compiled(x)
            grown = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
    assert grown < 4 * 1024, grown


def test_release_frees_plans(backend):
    model = _mlp()
    compiled = tc.compile(model, cache_dir=False)
    x = tc.randn(2, 4)
    compiled(x), compiled(x)
    assert compiled.plan_info()[0]["arena_bytes"] > 0
    compiled.release()
    assert compiled.cache_info().plans == 0 and compiled.plan_info() == []
    assert _same(compiled(x), model(x))
    assert compiled.cache_info().traces == 2
