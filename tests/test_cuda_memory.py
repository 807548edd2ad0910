"""GPU memory: a training loop must not grow the CuPy pool's allocated bytes."""

from __future__ import annotations

import numpy as np
import pytest

import optim
import tensorcore as tc
import tensorcore.functional as F
from layers import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential

pytestmark = pytest.mark.gpu


def test_a_thousand_train_steps_leave_allocated_bytes_stable() -> None:
    rng = np.random.default_rng(0)
    x = tc.tensor(rng.standard_normal((32, 1, 8, 8)).astype(np.float32), device="cuda")
    y = tc.tensor(rng.integers(0, 10, 32), device="cuda")
    model = Sequential(Conv2d(1, 16, 3, padding=1), ReLU(), MaxPool2d(2), Flatten(), Linear(16 * 16, 10)).to("cuda")
    opt = optim.Adam(model.parameters(), lr=1e-3)

    def step() -> tc.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(10):  # the optimizer packs its flat buffers on the first step
        step()
    tc.cuda.synchronize()
    settled = tc.cuda.memory_allocated()
    for _ in range(1000):
        loss = step()
    tc.cuda.synchronize()
    assert np.isfinite(loss.item())
    del loss
    assert tc.cuda.memory_allocated() <= settled, (
        f"allocated bytes grew from {settled} to {tc.cuda.memory_allocated()} over 1000 steps")
