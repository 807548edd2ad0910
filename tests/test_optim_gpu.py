"""GPU optimizers: the fused CuPy kernels against the NumPy path, and a training step
captured as a CUDA graph against the same steps run eagerly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import optim
import tensorcore as tc
import tensorcore.functional as F
from layers import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential
from layers.parameter import Parameter

pytestmark = pytest.mark.gpu

SHAPES = [(16, 3, 3, 3), (16,), (37,), (10, 64), (1,), (4099,)]

CASES = [
    (optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (optim.SGD, dict(lr=0.05)),
    (optim.Adam, dict(lr=1e-2, weight_decay=0.01, amsgrad=True)),
    (optim.AdamW, dict(lr=1e-2)),
    (optim.RMSprop, dict(lr=1e-2, centered=True, momentum=0.5, weight_decay=0.01)),
    (optim.RMSprop, dict(lr=1e-2)),
    (optim.Adagrad, dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)),
    (optim.LAMB, dict(lr=1e-2, weight_decay=0.01)),
    (optim.LARS, dict(lr=0.5, weight_decay=1e-3)),
    (optim.Lion, dict(lr=1e-3, weight_decay=0.1)),
]


def _run(cls: type, options: dict, device: str, dtype: Any, steps: int = 20) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(dtype) for s in SHAPES] for _ in range(steps)]
    params = [Parameter(tc.tensor(v, device=device)) for v in values]
    opt = cls(params, **options)
    opt.zero_grad(set_to_none=False)
    for k, step_grads in enumerate(grads):
        opt.zero_grad(set_to_none=k % 2 == 0)  # both the gather and the in-place paths
        for p, g in zip(params, step_grads):
            if p.grad is None:
                p.grad = tc.tensor(g, device=device)
            else:
                p.grad.data[...] = p.grad.backend.from_numpy(g)
        opt.step()
    return [p.numpy() for p in params]


def test_the_cupy_backend_has_fused_optimizer_kernels() -> None:
    from tensorcore.backends import backend_for
    from tensorcore.backends.cupy.optim import CupyOptimKernels

    assert isinstance(backend_for("cuda"), CupyOptimKernels)


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-10), (np.float32, 2e-5)], ids=["float64", "float32"])
@pytest.mark.parametrize("cls,options", CASES, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(CASES)])
def test_fused_kernels_match_the_numpy_path(cls: type, options: dict, dtype: Any, rtol: float) -> None:
    with tc.use_backend("numpy"):
        want = _run(cls, options, "cpu", dtype)
    got = _run(cls, options, "cuda", dtype)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * np.abs(b).max())


def _cnn() -> Sequential:
    return Sequential(Conv2d(1, 8, 3, padding=1), ReLU(), MaxPool2d(2), Conv2d(8, 16, 3, padding=1), ReLU(),
                      Flatten(), Linear(16 * 4 * 4, 10)).to("cuda")


def test_a_captured_training_step_replays_like_eager_steps() -> None:
    """1 eager warm-up step + a captured step replayed 100 times == 101 eager steps
    (Adam, a cosine schedule and gradient clipping all inside the step)."""
    import cupy

    rng = np.random.default_rng(0)
    x = tc.tensor(rng.standard_normal((32, 1, 8, 8)).astype(np.float32), device="cuda")
    y = tc.tensor(rng.integers(0, 10, 32), device="cuda")

    initial = _cnn().state_dict()

    def trainer() -> tuple[Sequential, Any]:
        model = _cnn()
        model.load_state_dict(initial)
        opt = optim.Adam(model.parameters(), lr=1e-2)
        sched = optim.CosineAnnealingLR(opt, T_max=60, eta_min=1e-4)
        opt.zero_grad(set_to_none=False)

        def step() -> None:
            opt.zero_grad(set_to_none=False)
            F.cross_entropy(model(x), y).backward()
            optim.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
        return model, step

    eager_model, eager_step = trainer()
    for _ in range(101):
        eager_step()
    want = [p.numpy().copy() for p in eager_model.parameters()]
    cupy.cuda.Device().synchronize()

    model, step = trainer()
    # the state dict was loaded on the default stream, which a non-blocking stream does
    # not wait for
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        step()  # warm-up: compiles kernels and packs the flat buffers
        stream.synchronize()
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        for _ in range(100):
            graph.launch(stream)
        stream.synchronize()
    for a, b in zip([p.numpy() for p in model.parameters()], want):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
