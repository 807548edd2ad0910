"""Optimizers without torch: LAMB, LARS and Lion against float64 transcriptions of their
papers, flat-buffer layout, bounds, resume from a checkpoint, and input checking."""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import pytest

import optim
import tensorcore as tc
from layers.module import Module
from layers.parameter import Parameter
from optim.flat import ALIGN_BYTES, address

SHAPES = [(4, 3), (7,), (2, 3, 2), (1,), (65,)]


def _initial(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in SHAPES]


def _gradients(seed: int = 1, steps: int = 50) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s) for s in SHAPES] for _ in range(steps)]


def _params(values: list[np.ndarray]) -> list[Parameter]:
    return [Parameter(tc.tensor(v.copy(), dtype=tc.float64)) for v in values]


def _feed(params: list[Parameter], grads: list[np.ndarray]) -> None:
    for p, g in zip(params, grads):
        p.grad = tc.tensor(g, dtype=tc.float64)


# ----- float64 transcriptions of the papers' updates, one tensor at a time ------------
def lamb_reference(values, grads, lr, beta1, beta2, eps, wd):
    """You et al. 2020, "Large Batch Optimization for Deep Learning", Algorithm 2 with
    φ(z) = z: m = β1 m + (1-β1) g, v = β2 v + (1-β2) g², r = m̂ / (√v̂ + ε),
    x -= η ‖x‖ / ‖r + λx‖ · (r + λx), the ratio taken as 1 when a norm is zero."""
    xs = [v.copy() for v in values]
    ms, vs = [np.zeros_like(x) for x in xs], [np.zeros_like(x) for x in xs]
    for t, step_grads in enumerate(grads, start=1):
        for x, m, v, g in zip(xs, ms, vs, step_grads):
            m[...] = beta1 * m + (1 - beta1) * g
            v[...] = beta2 * v + (1 - beta2) * g * g
            r = (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps)
            u = r + wd * x
            x_norm, u_norm = np.linalg.norm(x), np.linalg.norm(u)
            ratio = x_norm / u_norm if x_norm > 0 and u_norm > 0 else 1.0
            x -= lr * ratio * u
    return xs


def lars_reference(values, grads, lr, momentum, wd, eta, eps):
    """You, Gitman & Ginsburg 2017, "Large Batch Training of Convolutional Networks",
    Algorithm 1: λ = η ‖w‖ / (‖∇L‖ + β‖w‖) (+ ε, and 1 when a norm is zero),
    v = m v + γ λ (∇L + β w), w -= v."""
    ws = [v.copy() for v in values]
    bufs = [np.zeros_like(w) for w in ws]
    for step_grads in grads:
        for w, buf, g in zip(ws, bufs, step_grads):
            w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
            local = eta * w_norm / (g_norm + wd * w_norm + eps) if w_norm > 0 and g_norm > 0 else 1.0
            buf[...] = momentum * buf + lr * local * (g + wd * w)
            w -= buf
    return ws


def lion_reference(values, grads, lr, beta1, beta2, wd):
    """Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Program 1:
    c = β1 m + (1-β1) g, θ -= η (sign(c) + λθ), m = β2 m + (1-β2) g."""
    xs = [v.copy() for v in values]
    ms = [np.zeros_like(x) for x in xs]
    for step_grads in grads:
        for x, m, g in zip(xs, ms, step_grads):
            c = beta1 * m + (1 - beta1) * g
            x -= lr * (np.sign(c) + wd * x)
            m[...] = beta2 * m + (1 - beta2) * g
    return xs


PAPER_CASES = [
    (optim.LAMB, dict(lr=1e-2), lambda v, g: lamb_reference(v, g, 1e-2, 0.9, 0.999, 1e-6, 0.0)),
    (optim.LAMB, dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.05),
     lambda v, g: lamb_reference(v, g, 1e-2, 0.8, 0.99, 1e-8, 0.05)),
    (optim.LARS, dict(lr=0.5), lambda v, g: lars_reference(v, g, 0.5, 0.9, 0.0, 1e-3, 0.0)),
    (optim.LARS, dict(lr=0.5, momentum=0.8, weight_decay=1e-3, trust_coefficient=0.02, eps=1e-9),
     lambda v, g: lars_reference(v, g, 0.5, 0.8, 1e-3, 0.02, 1e-9)),
    (optim.Lion, dict(lr=1e-3), lambda v, g: lion_reference(v, g, 1e-3, 0.9, 0.99, 0.0)),
    (optim.Lion, dict(lr=1e-3, betas=(0.95, 0.98), weight_decay=0.1),
     lambda v, g: lion_reference(v, g, 1e-3, 0.95, 0.98, 0.1)),
]


@pytest.mark.parametrize("cls,options,reference", PAPER_CASES,
                         ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(PAPER_CASES)])
def test_matches_the_papers_update_for_50_steps(cls: type, options: dict, reference: Callable) -> None:
    values, grads = _initial(), _gradients()
    params = _params(values)
    opt = cls(params, **options)
    for step_grads in grads:
        _feed(params, step_grads)
        opt.step()
    for p, want in zip(params, reference(values, grads)):
        np.testing.assert_allclose(p.numpy(), want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


# ----- flat buffers ------------------------------------------------------------------
def test_parameters_and_grads_are_aligned_views_of_one_buffer() -> None:
    params = _params(_initial())
    opt = optim.Adam(params)
    _feed(params, _gradients(steps=1)[0])
    opt.step()
    storage = opt._packing.buffers[("cpu", np.dtype(np.float64))].storage
    for p in params:
        assert np.shares_memory(p.data, storage) and np.shares_memory(p.grad.data, storage)
        assert address(p.data) % ALIGN_BYTES == 0 and address(p.grad.data) % ALIGN_BYTES == 0


def test_backward_accumulates_into_the_flat_buffer() -> None:
    params = _params(_initial())
    opt = optim.SGD(params, lr=0.1)
    for p in params:
        p.grad = tc.zeros(*p.shape, dtype=tc.float64)
    opt.zero_grad(set_to_none=False)
    views = [p.grad.data for p in params]
    before = [p.numpy().copy() for p in params]
    sum((p * 2.0).sum() for p in params).backward()
    assert all(p.grad.data is v for p, v in zip(params, views))
    opt.step()
    for p, b in zip(params, before):
        np.testing.assert_allclose(p.numpy(), b - 0.2)


def test_reassigned_parameter_values_are_taken_up() -> None:
    params = _params(_initial())
    opt = optim.SGD(params, lr=1.0)
    _feed(params, _gradients(steps=1)[0])
    opt.step()
    params[0].data = np.ones(SHAPES[0])  # e.g. a model's load_state_dict
    params[0].grad = tc.ones(*SHAPES[0], dtype=tc.float64)
    opt.step()
    np.testing.assert_array_equal(params[0].numpy(), np.zeros(SHAPES[0]))


def test_bounds_are_applied_inside_the_step() -> None:
    t = Parameter(tc.tensor([0.5, 0.01, 2.0], dtype=tc.float64), bounds=(1e-6, 1.0))
    w = Parameter(tc.tensor([0.5, -3.0], dtype=tc.float64))
    opt = optim.SGD([t, w], lr=1.0)
    t.grad = tc.tensor([1.0, 0.0, -5.0], dtype=tc.float64)
    w.grad = tc.tensor([1.0, -5.0], dtype=tc.float64)
    opt.step()
    np.testing.assert_array_equal(t.numpy(), [1e-6, 0.01, 1.0])
    np.testing.assert_array_equal(w.numpy(), [-0.5, 2.0])


# ----- resume ------------------------------------------------------------------------
RESUME_CASES = [
    (optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (optim.Adam, dict(lr=1e-2, amsgrad=True, weight_decay=0.01)),
    (optim.AdamW, dict(lr=1e-2)),
    (optim.RMSprop, dict(lr=1e-2, centered=True, momentum=0.5)),
    (optim.Adagrad, dict(lr=0.1, lr_decay=0.01)),
    (optim.LAMB, dict(lr=1e-2, weight_decay=0.01)),
    (optim.LARS, dict(lr=0.5, weight_decay=1e-3)),
    (optim.Lion, dict(lr=1e-3, weight_decay=0.1)),
]


def _train(cls: type, options: dict, params: list[Parameter], grads: list[list[np.ndarray]],
           start: int, stop: int, checkpoint: dict | None = None) -> tuple[Any, Any]:
    opt = cls([{"params": params[:2]}, {"params": params[2:], "lr": options["lr"] * 0.5}], **options)
    sched = optim.CosineAnnealingLR(opt, T_max=30, eta_min=1e-4)
    if checkpoint is not None:
        opt.load_state_dict(checkpoint["optimizer"])
        sched.load_state_dict(checkpoint["scheduler"])
    for step_grads in grads[start:stop]:
        _feed(params, step_grads)
        opt.step()
        sched.step()
    return opt, sched


@pytest.mark.parametrize("cls,options", RESUME_CASES, ids=[c.__name__ for c, _ in RESUME_CASES])
def test_resume_from_step_20_is_bit_identical(cls: type, options: dict) -> None:
    values, grads = _initial(), _gradients()
    straight = _params(values)
    _train(cls, options, straight, grads, 0, 50)

    first = _params(values)
    opt, sched = _train(cls, options, first, grads, 0, 20)
    checkpoint = copy.deepcopy({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                                "params": [p.numpy().copy() for p in first]})
    resumed = [Parameter(tc.tensor(v, dtype=tc.float64)) for v in checkpoint["params"]]
    _train(cls, options, resumed, grads, 20, 50, checkpoint)
    for a, b in zip(resumed, straight):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# ----- checks ------------------------------------------------------------------------
def _p() -> Parameter:
    return Parameter(tc.tensor([1.0, 2.0], dtype=tc.float64))


@pytest.mark.parametrize("make", [
    lambda: optim.SGD([_p()], lr=float("nan")),
    lambda: optim.SGD([_p()], lr=-1.0),
    lambda: optim.SGD([_p()], lr=0.1, nesterov=True),
    lambda: optim.SGD([_p()], lr=0.1, momentum=-0.5),
    lambda: optim.Adam([_p()], betas=(-0.1, 0.999)),
    lambda: optim.Adam([_p()], betas=(0.9, 1.0)),
    lambda: optim.AdamW([_p()], eps=-1e-8),
    lambda: optim.RMSprop([_p()], alpha=-0.5),
    lambda: optim.Adagrad([_p()], lr_decay=-1.0),
    lambda: optim.LAMB([_p()], weight_decay=-0.1),
    lambda: optim.LARS([_p()], trust_coefficient=0.0),
    lambda: optim.Lion([_p()], betas=(0.9,)),
    lambda: optim.Adam([]),
])
def test_invalid_options_raise(make: Callable) -> None:
    with pytest.raises(ValueError):
        make()


def test_a_parameter_twice_or_a_non_leaf_raises() -> None:
    p = _p()
    with pytest.raises(ValueError, match="more than once"):
        optim.Adam([{"params": [p]}, {"params": [p]}])
    with pytest.raises(ValueError, match="non-leaf"):
        optim.Adam([p * 2.0])
    with pytest.raises(TypeError, match="floating point"):
        optim.Adam([tc.tensor([1, 2])])


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "LAMB", "LARS", "Lion"])
def test_one_parameter_instead_of_an_iterable_says_so(name: str) -> None:
    with pytest.raises(TypeError, match=f"^{name}: params must be an iterable of Parameters or dicts, got a Parameter"):
        getattr(optim, name)(_p(), lr=0.1)
    with pytest.raises(TypeError, match="got a dict"):
        getattr(optim, name)({"params": [_p()]}, lr=0.1)


def _stepped_adam() -> tuple[optim.Adam, list[Parameter], dict]:
    params = _params(_initial())
    opt = optim.Adam(params, lr=1e-2)
    for step_grads in _gradients(steps=3):
        _feed(params, step_grads)
        opt.step()
    _feed(params, _gradients(seed=5, steps=1)[0])
    return opt, params, copy.deepcopy(opt.state_dict())


def _unchanged(opt: optim.Optimizer, params: list[Parameter], values: list[np.ndarray], state: dict) -> None:
    for p, v in zip(params, values):
        np.testing.assert_array_equal(p.numpy(), v)
    after = opt.state_dict()["state"]
    for n, entry in state["state"].items():
        for role, value in entry.items():
            np.testing.assert_array_equal(after[n][role], value)


@pytest.mark.parametrize("corrupt", ["nan-lr", "negative-beta", "dtype", "grad-shape"])
def test_a_bad_step_raises_before_updating_anything(corrupt: str) -> None:
    opt, params, state = _stepped_adam()
    values = [p.numpy().copy() for p in params]
    if corrupt == "nan-lr":
        opt.param_groups[0]["lr"] = float("nan")
    elif corrupt == "negative-beta":
        opt.param_groups[0]["betas"] = (0.9, -0.5)
    elif corrupt == "dtype":  # a module cast after the optimizer was made
        holder = Module()
        holder.p = params[-1]
        holder.to(dtype=tc.float32)
        values[-1] = params[-1].numpy().copy()
    else:
        params[-1].grad = tc.zeros(3, dtype=tc.float64)
    with pytest.raises(ValueError):
        opt.step()
    _unchanged(opt, params, values, state)


def test_a_mismatched_state_dict_is_rejected_untouched() -> None:
    opt, params, state = _stepped_adam()
    values = [p.numpy().copy() for p in params]
    bad = copy.deepcopy(state)
    bad["state"][0]["exp_avg"] = np.zeros((2, 2))
    with pytest.raises(ValueError, match="shape"):
        opt.load_state_dict(bad)
    bad = copy.deepcopy(state)
    bad["param_groups"].append(bad["param_groups"][0])
    with pytest.raises(ValueError, match="groups"):
        opt.load_state_dict(bad)
    bad = copy.deepcopy(state)
    bad["param_groups"][0]["lr"] = -1.0
    with pytest.raises(ValueError, match="learning rate"):
        opt.load_state_dict(bad)
    for index in (len(params), -1):
        bad = copy.deepcopy(state)
        bad["state"][index] = bad["state"][0]
        with pytest.raises(ValueError, match=f"names parameter {index}"):
            opt.load_state_dict(bad)
    _unchanged(opt, params, values, state)
    assert opt.param_groups[0]["lr"] == 1e-2


def test_schedule_checks() -> None:
    opt = optim.SGD([_p()], lr=0.1)
    with pytest.raises(ValueError):
        optim.StepLR(opt, step_size=0)
    with pytest.raises(ValueError):
        optim.LinearWarmup(opt, warmup_steps=5, start_factor=0.0)
    with pytest.raises(ValueError):
        optim.SequentialLR(opt, [optim.StepLR(opt, 2)], milestones=[3])
    with pytest.raises(ValueError):
        optim.clip_grad_norm_([_p()], max_norm=-1.0)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_over_several_update_slices(nesterov: bool) -> None:
    """Buffers longer than one update slice (the NumPy backend updates slice by slice)
    follow the float64 transcription of SGD with momentum and weight decay."""
    rng = np.random.default_rng(3)
    start = rng.standard_normal(300_001)
    grads = [rng.standard_normal(300_001) for _ in range(3)]
    p = Parameter(tc.tensor(start, dtype=tc.float64))
    opt = optim.SGD([p], lr=0.1, momentum=0.9, nesterov=nesterov, weight_decay=0.01)
    want, buf = start.copy(), None
    for g in grads:
        p.grad = tc.tensor(g, dtype=tc.float64)
        opt.step()
        d = g + 0.01 * want
        buf = d if buf is None else 0.9 * buf + d
        want = want - 0.1 * (d + 0.9 * buf if nesterov else buf)
    np.testing.assert_allclose(p.numpy(), want, rtol=1e-12, atol=1e-12)
