"""Convolution weights a CUDA-graph plan packs outside its graph: packed once, packed again
after any write into device memory, never for weights the plan computes or writes.  The
write count itself (``tensorcore.writes``) is checked on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

import layers
import optim
import tensorcore as tc
import tensorcore.functional as F
from tensorcore import writes
from tensorcore.backends.numpy.backend import NumpyBackend
from diffusion.training import EMAModel

gpu = pytest.mark.gpu


# ----- the write count (CPU) ---------------------------------------------------------------
class _Recording(NumpyBackend):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def add_(self, a, b):
        self.calls.append("add_")
        a += b

    def clip(self, a, low, high, out=None):
        self.calls.append("clip")
        return np.clip(a, low, high, out=out)


def test_in_place_methods_and_calls_given_out_note_a_write_and_others_do_not():
    noted = writes.noting_writes(type("Noted", (_Recording,), {}))()
    a = np.zeros(3)
    before = writes.writes()
    noted.add_(a, 1.0)
    after_add = writes.writes()
    noted.clip(a, 0.0, 0.5)  # a new array: nothing written
    after_clip = writes.writes()
    noted.clip(a, 0.0, 0.5, out=a)
    after_out = writes.writes()
    noted.clip(a, 0.0, 0.25, a)  # out given by position
    assert before != after_add == after_clip != after_out != writes.writes()
    assert np.array_equal(a, [0.25] * 3) and noted.calls == ["add_", "clip", "clip", "clip"]
    unwrapped = writes.unnoted(noted.add_)
    now = writes.writes()
    unwrapped(a, 1.0)
    assert writes.writes() == now and np.array_equal(a, [1.25] * 3)


def test_every_write_gets_a_number_never_seen_before():
    seen = set()
    for _ in range(100):
        writes.note_write()
        assert writes.writes() not in seen
        seen.add(writes.writes())


def test_unnoted_strips_only_the_noting_of_writes():
    plain = NumpyBackend()
    assert writes.unnoted(plain.copy_) == plain.copy_  # nothing to strip

    def recorder(*args):  # a trace's recorder is no bound method: kept, so the trace sees the call
        return args
    assert writes.unnoted(recorder) is recorder


def test_learning_rate_schedules_write_their_scalars_unnoted(monkeypatch):
    """A schedule's step writes the optimizer's lr scalars and its own step counter, from
    which nothing is derived: a plan's packed weights must not be made again for it."""
    backend = tc.backends.backend_for("cpu")
    for name in ("add_", "copy_"):  # the CPU backend as the CuPy one is: noting its writes
        monkeypatch.setattr(backend, name, writes._always(getattr(type(backend), name)).__get__(backend))
    w = layers.Linear(3, 2)
    optimizer = optim.AdamW(w.parameters(), lr=0.1)
    schedule = optim.CosineAnnealingLR(optimizer, T_max=10)
    (w(tc.randn(4, 3)) ** 2).mean().backward()
    optimizer.step()  # packs the parameters into the optimizer's buffers
    before = writes.writes()
    for _ in range(3):
        schedule.step()
    assert writes.writes() == before and optimizer.param_groups[0]["lr"] < 0.1
    backend.copy_(np.zeros(2), np.ones(2))  # any other copy is noted
    assert writes.writes() != before


def test_a_write_that_directly_follows_a_known_number_keeps_what_was_derived_then():
    seen = writes.writes()
    kept = writes.note_write_after(seen)
    assert kept == writes.writes() != seen
    writes.note_write()  # another write in between: what was derived at `kept` is stale
    stale = writes.writes()
    assert writes.note_write_after(kept) is None and writes.writes() not in (stale, kept)
    assert writes.note_write_after(None) is None


# ----- packed weights (GPU) -----------------------------------------------------------------
class _Convs(layers.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = layers.Conv2d(32, 64, 3, padding=1)
        self.second = layers.Conv2d(64, 32, 3, padding=1)

    def forward(self, x: tc.Tensor) -> tc.Tensor:
        return self.second(F.silu(self.first(x)))


def _model(dtype) -> _Convs:
    tc.manual_seed(0)
    return _Convs().to("cuda").to(dtype=dtype).eval()


def _executor(compiled):
    (entry,) = compiled._plans.values()
    return entry.executor


def _agrees(compiled, model, x) -> None:
    """Compiled == eager: bit for bit in float32; in bfloat16 within a few bfloat16
    roundings of the outputs' scale (the fused epilogue rounds act(conv + bias) once
    where eager rounds twice, and the second convolution sums 576 such values), far
    below what a stale weight changes."""
    with tc.no_grad():
        got, want = compiled(x).float().numpy(), model(x).float().numpy()
    if x.dtype == tc.bfloat16:
        assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
    else:
        assert np.array_equal(got, want)


@gpu
@pytest.mark.parametrize("dtype, precision", [(tc.float32, "high"), (tc.float32, "highest"),
                                              (tc.bfloat16, "high")])
def test_packed_weights_are_packed_again_after_every_kind_of_write(dtype, precision):
    previous = tc.get_matmul_precision()
    tc.set_matmul_precision(precision)
    try:
        model = _model(dtype)
        compiled = tc.compile(model, cache_dir=False)
        x = tc.randn(2, 32, 16, 16, device="cuda").to(dtype=dtype)
        _agrees(compiled, model, x)
        _agrees(compiled, model, x)
        packs = _executor(compiled).weight_packs
        assert len(packs) == 2  # both 3x3 weights, kept out of the graph
        packed_at = packs.written
        _agrees(compiled, model, x)
        assert packs.written == packed_at  # nothing was written: not packed again

        def after(write) -> None:
            with tc.no_grad():
                write()
            _agrees(compiled, model, x)

        after(lambda: model.first.weight.add_(0.25))
        after(lambda: model.second.weight.copy_(tc.randn(32, 64, 3, 3, device="cuda")))
        after(lambda: model.first.weight.__setitem__(0, 1.0))
        after(lambda: model.first.weight[1].mul_(-2.0))  # through a view
        after(lambda: model.load_state_dict(_model(dtype).state_dict()))
        ema = EMAModel(model.parameters(), decay=0.5)
        after(lambda: model.first.weight.fill_(0.01))
        after(lambda: ema.copy_to(model.parameters()))
        optimizer = optim.AdamW(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            model.train()
            (model(x).float() ** 2).mean().backward()
            optimizer.step()
            model.eval()
            _agrees(compiled, model, x)
        # the optimizer's first step moves the parameters into its flat buffer: new
        # storage, so one more trace; later steps write them in place
        assert compiled.cache_info().traces == 2
    finally:
        tc.set_matmul_precision(previous)


def _train_step(m: _Convs, batch: tc.Tensor, optimizer: optim.Optimizer) -> tc.Tensor:
    optimizer.zero_grad(set_to_none=False)
    loss = (m(batch) ** 2).mean()
    loss.backward()
    optimizer.step()
    return loss


@gpu
def test_a_compiled_training_step_is_a_write_other_plans_see():
    model = _model(tc.float32)
    infer = tc.compile(model, cache_dir=False)
    optimizer = optim.AdamW(model.parameters(), lr=0.1)
    x = tc.randn(2, 32, 16, 16, device="cuda")
    train = tc.compile(_train_step, cache_dir=False)
    for _ in range(4):
        model.train()
        train(model, x, optimizer)
        model.eval()
        _agrees(infer, model, x)
    assert train.cache_info().hits >= 2 and _executor(train).writes_modules
    assert len(_executor(infer).weight_packs) == 2


@gpu
def test_weights_a_plan_computes_are_packed_in_its_graph():
    model = _model(tc.float32)
    compiled = tc.compile(lambda x: F.conv2d(x, model.first.weight * 2.0, padding=1), cache_dir=False)
    x = tc.randn(2, 32, 16, 16, device="cuda")
    with tc.no_grad():
        for scale in (1.0, -3.0):
            model.first.weight.mul_(scale)
            assert np.array_equal(compiled(x).numpy(), F.conv2d(x, model.first.weight * 2.0, padding=1).numpy())
    assert len(_executor(compiled).weight_packs) == 0


@gpu
def test_a_training_step_keeps_its_frozen_convolutions_packed_across_its_own_writes():
    step = _train_step
    compiled = tc.compile(step, cache_dir=False)
    x = tc.randn(2, 32, 16, 16, device="cuda")
    fills, losses = [], []
    for run in (compiled, step):  # one after the other: the eager run's writes would count
        model = _model(tc.float32).train()
        model.first.weight.requires_grad_(False)
        model.first.bias.requires_grad_(False)
        optimizer = optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
        schedule = optim.CosineAnnealingLR(optimizer, T_max=20)  # stepped between steps, as Trainer does

        def run_step() -> float:
            loss = run(model, x, optimizer).item()
            schedule.step()
            return loss
        # the optimizer's first step moves the parameters: traced twice, then replayed
        losses.append([run_step() for _ in range(3)])
        if run is compiled:
            executor = _executor(compiled)
            packs = executor.weight_packs
            assert executor.writes_modules and len(packs) == 1  # the frozen 3x3 weight alone
            packs._fills = [lambda fill=fill: fills.append(1) or fill() for fill in packs._fills]
            hits = compiled.cache_info().hits
        for i in range(4):
            if i == 2:  # a write from outside the plan: packed again once
                with tc.no_grad():
                    model.first.weight.mul_(0.5)
            losses[-1].append(run_step())
    assert len(fills) == 1 and compiled.cache_info().hits == hits + 4
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
