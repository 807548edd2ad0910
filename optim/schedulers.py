"""Learning-rate schedules that run on the device: StepLR, CosineAnnealingLR,
LinearWarmup, and their compositions SequentialLR and ChainedScheduler.

Each schedule is one formula ``lr_at(base_lr, t, backend)`` over a 1-element float64
step array ``t``, written with array operators and the backend's ``unary`` / ``clip`` /
``where``.  ``step()`` evaluates it twice with the same code: on the parameters' device,
from a device step counter, into the optimizer's lr scalars (so a step captured in a
CUDA graph replays the schedule), and on the CPU into ``group["lr"]`` (so reading the
lr never waits for the device).  Values follow ``torch.optim.lr_scheduler``'s closed forms.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tensorcore.backends import backend_for
from tensorcore.backends.base import Backend

from .optimizer import Optimizer


class LRScheduler:
    """Base: sets each group's lr to ``lr_at(initial_lr, last_epoch)`` on every ``step()``."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__}: expected an Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(f"{type(self).__name__}: resuming at last_epoch={last_epoch} needs 'initial_lr' "
                               "in every param group")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._counters: dict[str, Any] = {}
        self._ones: dict[str, Any] = {}
        self.step()

    def lr_at(self, base_lr: float, t: Any, backend: Backend) -> Any:
        """The lr at step ``t`` (a 1-element float64 array of ``backend``)."""
        return base_lr

    def step(self) -> None:
        """Advance one step and set every group's lr, on the device and on the host."""
        self.last_epoch += 1
        for device, counter in self._counters.items():
            backend_for(device).add_(counter, self._ones[device])
        self._apply()

    def _counter(self, device: str) -> Any:
        """The device step counter (float64, 1 element) of ``device``."""
        if device not in self._counters:
            backend = backend_for(device)
            self._counters[device] = backend.full((1,), float(self.last_epoch), np.float64)
            self._ones[device] = backend.full((1,), 1.0, np.float64)
        return self._counters[device]

    def _apply(self) -> None:
        for index, (group, base) in enumerate(zip(self.optimizer.param_groups, self.base_lrs)):
            device = group["params"][0].device
            backend = backend_for(device)
            device_lr = self.lr_at(base, self._counter(device), backend)
            host = backend_for("cpu")
            host_lr = float(np.asarray(self.lr_at(base, np.full(1, float(self.last_epoch)), host)).item())
            self.optimizer._set_lr(index, host_lr, device_lr)

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the step count and re-derive the device lr from it, bit for bit."""
        self.last_epoch = int(state_dict["last_epoch"])
        self.base_lrs = list(state_dict["base_lrs"])
        for device in self._counters:
            backend = backend_for(device)
            backend.copy_(self._counters[device], backend.full((1,), float(self.last_epoch), np.float64))
        self._apply()


class StepLR(LRScheduler):
    """lr = base · gamma^⌊t / step_size⌋."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        if int(step_size) != step_size or step_size < 1:
            raise ValueError(f"StepLR: step_size must be a positive integer, got {step_size!r}")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, t: Any, backend: Backend) -> Any:
        return base_lr * self.gamma ** backend.unary("floor", t / self.step_size)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base - eta_min) · (1 + cos(π t / T_max)) / 2."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        if T_max <= 0:
            raise ValueError(f"CosineAnnealingLR: T_max must be > 0, got {T_max!r}")
        self.T_max, self.eta_min = T_max, float(eta_min)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, t: Any, backend: Backend) -> Any:
        return self.eta_min + (base_lr - self.eta_min) * (1 + backend.unary("cos", np.pi * t / self.T_max)) / 2


class LinearWarmup(LRScheduler):
    """lr = base · (start_factor + (1 - start_factor) · min(t, warmup_steps) / warmup_steps):
    a linear ramp to the base lr, then constant (``torch``'s LinearLR with end_factor 1)."""

    def __init__(self, optimizer: Optimizer, warmup_steps: int, start_factor: float = 0.1,
                 last_epoch: int = -1) -> None:
        if int(warmup_steps) != warmup_steps or warmup_steps < 1:
            raise ValueError(f"LinearWarmup: warmup_steps must be a positive integer, got {warmup_steps!r}")
        if not 0 < start_factor <= 1:
            raise ValueError(f"LinearWarmup: start_factor must be in (0, 1], got {start_factor!r}")
        self.warmup_steps, self.start_factor = int(warmup_steps), float(start_factor)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, t: Any, backend: Backend) -> Any:
        ramp = backend.clip(t, None, float(self.warmup_steps)) / self.warmup_steps
        return base_lr * (self.start_factor + (1.0 - self.start_factor) * ramp)


class SequentialLR(LRScheduler):
    """``schedulers[k]`` from ``milestones[k-1]`` on, counting its steps from there."""

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int],
                 last_epoch: int = -1) -> None:
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} milestones, "
                             f"got {len(milestones)}")
        if any(s.optimizer is not optimizer for s in schedulers):
            raise ValueError("SequentialLR: every scheduler must drive the same optimizer")
        self.schedulers, self.milestones = list(schedulers), [int(m) for m in milestones]
        for group, base in zip(optimizer.param_groups, self.schedulers[0].base_lrs):
            group["lr"] = base
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, t: Any, backend: Backend) -> Any:
        lr = self.schedulers[0].lr_at(base_lr, t, backend)
        for scheduler, milestone in zip(self.schedulers[1:], self.milestones):
            lr = backend.where(t >= milestone, scheduler.lr_at(base_lr, t - milestone, backend), lr)
        return lr


class ChainedScheduler(LRScheduler):
    """Every scheduler applied on top of the previous one's lr (for multiplicative
    schedules such as StepLR and LinearWarmup: the product of their factors)."""

    def __init__(self, schedulers: Sequence[LRScheduler], optimizer: Optimizer | None = None) -> None:
        optimizer = optimizer if optimizer is not None else schedulers[0].optimizer
        if any(s.optimizer is not optimizer for s in schedulers):
            raise ValueError("ChainedScheduler: every scheduler must drive the same optimizer")
        self.schedulers = list(schedulers)
        super().__init__(optimizer)

    def lr_at(self, base_lr: float, t: Any, backend: Backend) -> Any:
        lr = base_lr
        for scheduler in self.schedulers:
            lr = scheduler.lr_at(lr, t, backend)
        return lr
