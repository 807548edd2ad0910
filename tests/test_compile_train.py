"""A compiled train step (forward, backward, optimizer step) equals the eager step.

Twenty steps of a small MLP with dropout, compiled as one function, must leave the
parameters and the optimizer state exactly where twenty eager steps leave them, for
each optimizer of the flat fused family, each way of zeroing gradients, with gradient
clipping, an LR schedule stepped outside the compiled function and a learning rate
changed by hand.  The step replays one plan: backward and the optimizer update
included, parameters and state bound by reference.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import layers
import optim
import tensorcore as tc
import tensorcore.functional as F

OPTIMIZERS = {
    "AdamW": lambda ps: optim.AdamW(ps, lr=1e-2, weight_decay=0.05),
    "Adam_amsgrad": lambda ps: optim.Adam(ps, lr=1e-2, amsgrad=True),
    "SGD_nesterov": lambda ps: optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "RMSprop_centered": lambda ps: optim.RMSprop(ps, lr=1e-3, momentum=0.5, centered=True),
    "Adagrad": lambda ps: optim.Adagrad(ps, lr=1e-2, lr_decay=1e-3),
    "LAMB": lambda ps: optim.LAMB(ps, lr=1e-2),
    "LARS": lambda ps: optim.LARS(ps, lr=1e-2, momentum=0.9),
    "Lion": lambda ps: optim.Lion(ps, lr=1e-3),
}


def _model() -> layers.Module:
    tc.manual_seed(0)
    return layers.Sequential(layers.Linear(6, 16), layers.GELU(), layers.Dropout(0.25), layers.Linear(16, 3))


def _train(compiled: bool, make_opt: Callable, zero: str = "none", clip: bool = False,
           schedule: bool = False, steps: int = 20) -> tuple[list, list, dict, Any]:
    model = _model()
    opt = make_opt(model.parameters())
    sched = optim.CosineAnnealingLR(opt, T_max=steps) if schedule else None

    def step(x: tc.Tensor, y: tc.Tensor) -> tc.Tensor:
        if zero != "outside":
            opt.zero_grad(set_to_none=zero == "none")
        loss = F.mse_loss(model(x), y)
        loss.backward()
        if clip:
            optim.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        return loss

    run = tc.compile(step, cache_dir=False) if compiled else step
    rng = np.random.default_rng(1)
    tc.manual_seed(5)
    losses = []
    for i in range(steps):
        x = tc.tensor(rng.standard_normal((4, 6)).astype(np.float32))
        y = tc.tensor(rng.standard_normal((4, 3)).astype(np.float32))
        if zero == "outside":
            opt.zero_grad()
        if i == steps // 2:
            opt.param_groups[0]["lr"] *= 0.5  # a learning rate changed by hand
        losses.append(run(x, y).numpy())
        if sched is not None:
            sched.step()
    params = [p.numpy().copy() for p in model.parameters()]
    grads = [None if p.grad is None else p.grad.numpy().copy() for p in model.parameters()]
    return losses, params + grads, opt.state_dict(), run.cache_info() if compiled else None


def _assert_same_state(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        for role, value in a["state"][k].items():
            assert np.array_equal(np.asarray(value), np.asarray(b["state"][k][role])), (k, role)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_twenty_compiled_steps_equal_twenty_eager_steps(backend, name):
    eager = _train(False, OPTIMIZERS[name])
    compiled = _train(True, OPTIMIZERS[name])
    for a, b in zip(eager[0] + eager[1], compiled[0] + compiled[1]):
        assert np.array_equal(a, b)
    _assert_same_state(eager[2], compiled[2])
    info = compiled[3]
    assert info.hits >= 15 and info.eager_only == 0, info


@pytest.mark.parametrize("zero", ["none", "zeros", "outside"])
def test_zero_grad_variants_clipping_and_schedules(backend, zero):
    opt = OPTIMIZERS["AdamW"]
    eager = _train(False, opt, zero=zero, clip=True, schedule=True)
    compiled = _train(True, opt, zero=zero, clip=True, schedule=True)
    for a, b in zip(eager[0] + eager[1], compiled[0] + compiled[1]):
        assert (a is None and b is None) or np.array_equal(a, b)
    _assert_same_state(eager[2], compiled[2])
    assert compiled[3].hits >= 15


def test_train_step_is_one_plan_with_backward_and_update(backend):
    *_, info = _train(True, OPTIMIZERS["AdamW"], steps=6)
    assert info.plans == 1


def test_compiled_step_plan_covers_backward_and_optimizer():
    model = _model()
    opt = optim.AdamW(model.parameters(), lr=1e-2)

    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    compiled = tc.compile(step, cache_dir=False)
    for _ in range(4):
        compiled(tc.randn(4, 6), tc.randn(4, 3))
    ops = [line.split("= ")[-1].split("(")[0] for line in compiled.plan_info()[0]["graph"].splitlines()]
    assert "adam_update_" in ops and "activation_grad" in ops and "uniform" in ops  # GELU backward
