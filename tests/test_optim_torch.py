"""Optimizers, LR schedules and gradient clipping against torch (CPU, float64).

Every optimizer runs 50 steps on the same parameters and the same gradient sequence
as its ``torch.optim`` counterpart and must agree within 1e-10 relative.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import optim
import tensorcore as tc
from layers.parameter import Parameter

torch = pytest.importorskip("torch")

SHAPES = [(4, 3), (7,), (2, 3, 2), (1,), (65,)]
STEPS = 50


def _initial(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in SHAPES]


def _gradients(seed: int = 1, steps: int = STEPS) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s) for s in SHAPES] for _ in range(steps)]


def _ours(values: list[np.ndarray]) -> list[Parameter]:
    return [Parameter(tc.tensor(v.copy(), dtype=tc.float64)) for v in values]


def _theirs(values: list[np.ndarray]) -> list[Any]:
    return [torch.tensor(v.copy(), requires_grad=True) for v in values]


def assert_close(ours: list[Any], theirs: list[np.ndarray], rtol: float = 1e-10) -> None:
    """Relative to the largest magnitude of each reference tensor."""
    for a, b in zip(ours, theirs):
        a, b = np.asarray(a.numpy() if hasattr(a, "numpy") else a), np.asarray(b)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(np.abs(b).max(), 1e-300))


def _torch_values(params: list[Any]) -> list[np.ndarray]:
    return [p.detach().numpy() for p in params]


CASES = [
    ("SGD", dict(lr=0.05)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("Adam", dict(lr=1e-2)),
    ("Adam", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, amsgrad=True)),
    ("AdamW", dict(lr=1e-2)),
    ("AdamW", dict(lr=1e-2, weight_decay=0.3, amsgrad=True)),
    ("RMSprop", dict(lr=1e-2)),
    ("RMSprop", dict(lr=1e-2, alpha=0.9, weight_decay=0.05, momentum=0.8, centered=True)),
    ("RMSprop", dict(lr=1e-2, momentum=0.5)),
    ("Adagrad", dict(lr=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.02, initial_accumulator_value=0.3, eps=1e-8)),
]


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
@pytest.mark.parametrize("fresh_grads", [True, False], ids=["fresh-grads", "grads-in-place"])
def test_matches_torch_for_50_steps(name: str, options: dict, fresh_grads: bool) -> None:
    """fresh_grads: ``.grad`` is a new tensor every step (the zero_grad() loop);
    otherwise gradients accumulate into the flat buffer (zero_grad(set_to_none=False))."""
    values, grads = _initial(), _gradients()
    ours, theirs = _ours(values), _theirs(values)
    opt = getattr(optim, name)(ours, **options)
    ref = getattr(torch.optim, name)(theirs, **options)
    for step_grads in grads:
        if fresh_grads:
            opt.zero_grad()
            for p, g in zip(ours, step_grads):
                p.grad = tc.tensor(g.copy(), dtype=tc.float64)
        else:
            opt.zero_grad(set_to_none=False)
            loss = sum((p * tc.tensor(g, dtype=tc.float64)).sum() for p, g in zip(ours, step_grads))
            loss.backward()
        for q, g in zip(theirs, step_grads):
            q.grad = torch.tensor(g)
        opt.step()
        ref.step()
    assert_close(ours, _torch_values(theirs))
    for p, q in zip(ours, theirs):
        for role, value in ref.state[q].items():
            if role != "step":
                assert_close([opt.state[p][role]], [value.numpy()])


def test_param_groups_with_their_own_options() -> None:
    values, grads = _initial(), _gradients()
    ours, theirs = _ours(values), _theirs(values)
    opt = optim.Adam([{"params": ours[:2]}, {"params": ours[2:], "lr": 0.05, "amsgrad": True}],
                     lr=1e-2, weight_decay=0.01)
    ref = torch.optim.Adam([{"params": theirs[:2]}, {"params": theirs[2:], "lr": 0.05, "amsgrad": True}],
                           lr=1e-2, weight_decay=0.01)
    for step_grads in grads:
        for p, q, g in zip(ours, theirs, step_grads):
            p.grad, q.grad = tc.tensor(g, dtype=tc.float64), torch.tensor(g)
        opt.step()
        ref.step()
    assert_close(ours, _torch_values(theirs))


def test_parameters_without_gradient_are_skipped_like_torch() -> None:
    values, grads = _initial(), _gradients()
    ours, theirs = _ours(values), _theirs(values)
    opt, ref = optim.Adam(ours, lr=1e-2, weight_decay=0.1), torch.optim.Adam(theirs, lr=1e-2, weight_decay=0.1)
    for k, step_grads in enumerate(grads):
        opt.zero_grad()
        ref.zero_grad()
        for i, (p, q, g) in enumerate(zip(ours, theirs, step_grads)):
            if (i + k) % 3:  # a shifting subset of parameters has no gradient
                p.grad, q.grad = tc.tensor(g, dtype=tc.float64), torch.tensor(g)
        opt.step()
        ref.step()
    assert_close(ours, _torch_values(theirs))


def test_add_param_group_after_steps_keeps_state() -> None:
    values, grads = _initial(), _gradients()
    ours, theirs = _ours(values), _theirs(values)
    opt = optim.SGD(ours[:3], lr=0.05, momentum=0.9)
    ref = torch.optim.SGD(theirs[:3], lr=0.05, momentum=0.9)
    for k, step_grads in enumerate(grads):
        if k == 10:
            opt.add_param_group({"params": ours[3:], "lr": 0.01})
            ref.add_param_group({"params": theirs[3:], "lr": 0.01})
        n = 3 if k < 10 else len(SHAPES)
        for p, q, g in list(zip(ours, theirs, step_grads))[:n]:
            p.grad, q.grad = tc.tensor(g, dtype=tc.float64), torch.tensor(g)
        opt.step()
        ref.step()
    assert_close(ours, _torch_values(theirs))


# ----- LR schedules -----------------------------------------------------------------
def _schedule_pair(make_ours, make_theirs):
    values = _initial()
    ours, theirs = _ours(values), _theirs(values)
    opt, ref = optim.SGD(ours, lr=0.5, momentum=0.9), torch.optim.SGD(theirs, lr=0.5, momentum=0.9)
    return opt, ref, ours, theirs, make_ours(opt), make_theirs(ref)


SCHEDULES = {
    "step": (lambda o: optim.StepLR(o, step_size=7, gamma=0.5),
             lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5)),
    "cosine": (lambda o: optim.CosineAnnealingLR(o, T_max=20, eta_min=0.01),
               lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=20, eta_min=0.01)),
    "warmup": (lambda o: optim.LinearWarmup(o, warmup_steps=8, start_factor=0.1),
               lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=8)),
    "warmup-then-cosine": (
        lambda o: optim.SequentialLR(o, [optim.LinearWarmup(o, 5, 0.2), optim.CosineAnnealingLR(o, 30)], [5]),
        lambda o: torch.optim.lr_scheduler.SequentialLR(
            o, [torch.optim.lr_scheduler.LinearLR(o, 0.2, total_iters=5),
                torch.optim.lr_scheduler.CosineAnnealingLR(o, 30)], [5])),
    "chained-step-warmup": (
        lambda o: optim.ChainedScheduler([optim.StepLR(o, 6, 0.7), optim.LinearWarmup(o, 9, 0.25)]),
        lambda o: torch.optim.lr_scheduler.ChainedScheduler(
            [torch.optim.lr_scheduler.StepLR(o, 6, 0.7), torch.optim.lr_scheduler.LinearLR(o, 0.25, total_iters=9)])),
}


@pytest.mark.parametrize("kind", list(SCHEDULES))
def test_schedules_match_torch(kind: str) -> None:
    """Host lr, device lr and the trajectory they drive all follow torch."""
    opt, ref, ours, theirs, sched, ref_sched = _schedule_pair(*SCHEDULES[kind])
    for step_grads in _gradients(steps=40):
        np.testing.assert_allclose(sched.get_last_lr(), ref_sched.get_last_lr(), rtol=1e-12)
        for p, q, g in zip(ours, theirs, step_grads):
            p.grad, q.grad = tc.tensor(g, dtype=tc.float64), torch.tensor(g)
        opt.step()
        ref.step()
        segment = opt._packing.segments[0]
        np.testing.assert_allclose(segment.lr, [ref_sched.get_last_lr()[0]], rtol=1e-12)
        sched.step()
        ref_sched.step()
    assert_close(ours, _torch_values(theirs))


# ----- gradient clipping --------------------------------------------------------------
def _flat_grads(opt: optim.Optimizer, params: list[Parameter], grads: list[np.ndarray]) -> None:
    """Give every parameter a gradient that is a view of the optimizer's flat buffer."""
    for p in params:
        p.grad = tc.zeros(*p.shape, dtype=tc.float64)
    opt.zero_grad(set_to_none=False)
    for p, g in zip(params, grads):
        p.grad.data[...] = g


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
@pytest.mark.parametrize("packed", [True, False], ids=["flat-buffer", "per-tensor"])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(norm_type: float, packed: bool, max_norm: float) -> None:
    values, (grads,) = _initial(), _gradients(steps=1)
    ours, theirs = _ours(values), _theirs(values)
    if packed:
        _flat_grads(optim.SGD(ours, lr=0.1), ours, grads)
    for p, q, g in zip(ours, theirs, grads):
        if not packed:
            p.grad = tc.tensor(g, dtype=tc.float64)
        q.grad = torch.tensor(g)
    total = optim.clip_grad_norm_(ours, max_norm, norm_type)
    ref_total = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type)
    np.testing.assert_allclose(total.numpy(), ref_total.numpy(), rtol=1e-12)
    assert_close([p.grad for p in ours], [q.grad.numpy() for q in theirs], rtol=1e-12)


def test_clip_grad_norm_on_a_subset_leaves_the_rest() -> None:
    values, (grads,) = _initial(), _gradients(steps=1)
    ours, theirs = _ours(values), _theirs(values)
    _flat_grads(optim.SGD(ours, lr=0.1), ours, grads)
    for q, g in zip(theirs, grads):
        q.grad = torch.tensor(g)
    optim.clip_grad_norm_(ours[1:3], 0.1)
    torch.nn.utils.clip_grad_norm_(theirs[1:3], 0.1)
    assert_close([p.grad for p in ours], [q.grad.numpy() for q in theirs], rtol=1e-12)


def test_clip_grad_value_matches_torch() -> None:
    values, (grads,) = _initial(), _gradients(steps=1)
    ours, theirs = _ours(values), _theirs(values)
    _flat_grads(optim.Adam(ours), ours, grads)
    for q, g in zip(theirs, grads):
        q.grad = torch.tensor(g)
    optim.clip_grad_value_(ours, 0.3)
    torch.nn.utils.clip_grad_value_(theirs, 0.3)
    assert_close([p.grad for p in ours], [q.grad.numpy() for q in theirs], rtol=0)


def test_float32_adamw_follows_torch() -> None:
    values, grads = _initial(), _gradients(steps=20)
    ours = [Parameter(tc.tensor(v.astype(np.float32))) for v in values]
    theirs = [torch.tensor(v.astype(np.float32), requires_grad=True) for v in values]
    opt, ref = optim.AdamW(ours, lr=1e-2), torch.optim.AdamW(theirs, lr=1e-2)
    for step_grads in grads:
        for p, q, g in zip(ours, theirs, step_grads):
            p.grad, q.grad = tc.tensor(g.astype(np.float32)), torch.tensor(g.astype(np.float32))
        opt.step()
        ref.step()
    assert_close(ours, _torch_values(theirs), rtol=1e-5)
