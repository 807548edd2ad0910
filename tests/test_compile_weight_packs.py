"""Convolution weights a CUDA-graph plan packs outside its graph: packed once, packed again
only after a write into their own memory (their storages' write versions), never for
weights the plan computes or writes.  The versions themselves are checked on the CPU in
``test_versions.py``."""

from __future__ import annotations

import numpy as np
import pytest

import layers
import optim
import tensorcore as tc
import tensorcore.functional as F
from diffusion.training import EMAModel

gpu = pytest.mark.gpu


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
        _agrees(compiled, model, x)
        assert packs.packed == 2  # packed before the first launch, not since: nothing was written

        def after(write, packed: int) -> None:
            """``write``, then a call that packs ``packed`` weights again."""
            made = packs.packed
            with tc.no_grad():
                write()
            _agrees(compiled, model, x)
            assert packs.packed == made + packed

        after(lambda: model.first.weight.add_(0.25), 1)
        after(lambda: model.second.weight.copy_(tc.randn(32, 64, 3, 3, device="cuda")), 1)
        after(lambda: model.first.weight.__setitem__(0, 1.0), 1)
        after(lambda: model.first.weight[1].mul_(-2.0), 1)  # through a view
        after(lambda: model.second.bias.add_(1.0), 0)  # no packed weight
        after(lambda: model.load_state_dict(_model(dtype).state_dict()), 2)
        ema = EMAModel(model.parameters(), decay=0.5)
        after(lambda: ema.step(model.parameters()), 0)  # writes the averages alone
        after(lambda: model.first.weight.fill_(0.01), 1)
        after(lambda: ema.copy_to(model.parameters()), 2)
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
    assert train.cache_info().hits >= 2
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
def test_a_training_step_keeps_its_frozen_convolutions_packed_across_writes_elsewhere():
    """Neither the plan's own writes (the trained parameters), nor a schedule's, nor an
    eager EMA update between compiled steps pack the frozen weight again; a write into
    it does, once."""
    step = _train_step
    compiled = tc.compile(step, cache_dir=False)
    x = tc.randn(2, 32, 16, 16, device="cuda")
    losses = []
    for run in (compiled, step):
        model = _model(tc.float32).train()
        model.first.weight.requires_grad_(False)
        model.first.bias.requires_grad_(False)
        trained = [p for p in model.parameters() if p.requires_grad]
        optimizer = optim.AdamW(trained, lr=0.05)
        schedule = optim.CosineAnnealingLR(optimizer, T_max=20)  # stepped between steps, as Trainer does
        ema = EMAModel(trained, decay=0.9)

        def run_step() -> float:
            loss = run(model, x, optimizer).item()
            schedule.step()
            ema.step(trained)
            return loss
        # the optimizer's first step moves the parameters: traced twice, then replayed
        losses.append([run_step() for _ in range(3)])
        if run is compiled:
            packs = _executor(compiled).weight_packs
            assert len(packs) == 1  # the frozen 3x3 weight alone
            packed, hits = packs.packed, compiled.cache_info().hits
        for i in range(4):
            if i == 2:  # a write into the frozen weight: packed again once
                with tc.no_grad():
                    model.first.weight.mul_(0.5)
            losses[-1].append(run_step())
    assert packs.packed == packed + 1 and compiled.cache_info().hits == hits + 4
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


@gpu
def test_a_weight_shared_through_dlpack_is_packed_again_at_every_launch():
    """Another library may write a weight exported through DLPack where no version
    counts it: the plan packs that weight before every launch, and only that one."""
    cupy = pytest.importorskip("cupy")
    model = _model(tc.float32)
    compiled = tc.compile(model, cache_dir=False)
    x = tc.randn(2, 32, 16, 16, device="cuda")
    _agrees(compiled, model, x)
    _agrees(compiled, model, x)
    packs = _executor(compiled).weight_packs
    made = packs.packed
    shared = cupy.from_dlpack(model.first.weight)
    shared *= -2.0  # written by another library
    _agrees(compiled, model, x)
    shared += 1.0
    _agrees(compiled, model, x)
    assert packs.packed == made + 2
