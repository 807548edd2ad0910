"""Exponential moving average of model weights, as diffusers' ``EMAModel`` keeps it.

Sampling from the averaged weights gives cleaner images than the last training step's
weights.  The decay ramps up from 0 (``(1 + n) / (10 + n)`` after ``n`` updates, or
the ``use_ema_warmup`` power law) to ``decay``, so early averages forget the random
initialisation quickly.  The shadow weights live on the parameters' device and are
updated there in place; the step's weight ``1 - decay`` lives in a device scalar per
(device, dtype) written by a host effect, so ``step`` can run inside a compiled train
step (a replay repeats the effect: the count advances and the new weight is read).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

import tensorcore as tc
from tensorcore import Tensor
from tensorcore.tracing import host_effect


class EMAModel:
    """Shadow copies of ``parameters`` updated by ``step`` after each optimizer step."""

    def __init__(self, parameters: Iterable[Tensor], decay: float = 0.9999, min_decay: float = 0.0,
                 update_after_step: int = 0, use_ema_warmup: bool = False, inv_gamma: float = 1.0,
                 power: float = 2 / 3) -> None:
        for name, value in (("decay", decay), ("min_decay", min_decay)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"EMAModel: {name} must be in [0, 1], got {value!r}")
        if min_decay > decay:
            raise ValueError(f"EMAModel: min_decay ({min_decay}) must not exceed decay ({decay})")
        if update_after_step < 0 or inv_gamma <= 0 or power <= 0:
            raise ValueError(f"EMAModel: need update_after_step >= 0, inv_gamma > 0 and power > 0, got "
                             f"{update_after_step}, {inv_gamma}, {power}")
        with tc.no_grad():
            self.shadow_params = [p.detach().clone() for p in parameters]
        self.decay, self.min_decay = float(decay), float(min_decay)
        self.update_after_step, self.use_ema_warmup = int(update_after_step), bool(use_ema_warmup)
        self.inv_gamma, self.power = float(inv_gamma), float(power)
        self.optimization_step = 0
        self._weights: dict[tuple[str, Any], Tensor] = {}
        for shadow in self.shadow_params:
            key = (shadow.device, shadow.dtype)
            if key not in self._weights:
                self._weights[key] = tc.zeros((), dtype=shadow.dtype, device=shadow.device)

    def get_decay(self, optimization_step: int) -> float:
        """The decay used at update number ``optimization_step`` (counted from 1)."""
        step = max(0, optimization_step - self.update_after_step - 1)
        if step <= 0:
            return 0.0
        if self.use_ema_warmup:
            value = 1 - (1 + step / self.inv_gamma) ** -self.power
        else:
            value = (1 + step) / (10 + step)
        return max(min(value, self.decay), self.min_decay)

    def step(self, parameters: Iterable[Tensor]) -> None:
        """Move every shadow weight towards its parameter: ``s -= (1 - decay) * (s - p)``."""
        params = self._matching(parameters, "step")
        host_effect(self._advance)
        with tc.no_grad():
            for shadow, p in zip(self.shadow_params, params):
                shadow -= (shadow - p.detach()) * self._weights[(shadow.device, shadow.dtype)]

    def _advance(self) -> None:
        """Count the update and write its weight ``1 - decay`` into the device scalars."""
        self.optimization_step += 1
        weight = 1.0 - self.get_decay(self.optimization_step)
        for scalar in self._weights.values():
            scalar.fill_(weight)  # in place: a compiled step holds the buffer by reference

    def copy_to(self, parameters: Iterable[Tensor]) -> None:
        """Write the averaged weights into ``parameters`` (e.g. a model to sample with)."""
        params = self._matching(parameters, "copy_to")
        with tc.no_grad():
            for shadow, p in zip(self.shadow_params, params):
                p.copy_(shadow)

    def state_dict(self) -> dict[str, Any]:
        """Options, update count and the shadow weights (host arrays), for checkpoints."""
        return {"decay": self.decay, "min_decay": self.min_decay, "update_after_step": self.update_after_step,
                "use_ema_warmup": self.use_ema_warmup, "inv_gamma": self.inv_gamma, "power": self.power,
                "optimization_step": self.optimization_step,
                "shadow_params": [s.numpy() for s in self.shadow_params]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict()``'s values (shapes checked before anything changes)."""
        arrays = [np.asarray(a) for a in state["shadow_params"]]
        if len(arrays) != len(self.shadow_params):
            raise ValueError(f"EMAModel.load_state_dict: {len(arrays)} shadow weights for "
                             f"{len(self.shadow_params)} parameters")
        for i, (array, shadow) in enumerate(zip(arrays, self.shadow_params)):
            if tuple(array.shape) != tuple(shadow.shape):
                raise ValueError(f"EMAModel.load_state_dict: shadow weight {i} has shape {tuple(array.shape)}, "
                                 f"expected {tuple(shadow.shape)}")
        for key in ("decay", "min_decay", "inv_gamma", "power"):
            setattr(self, key, float(state[key]))
        self.update_after_step, self.use_ema_warmup = int(state["update_after_step"]), bool(state["use_ema_warmup"])
        self.optimization_step = int(state["optimization_step"])
        with tc.no_grad():
            for array, shadow in zip(arrays, self.shadow_params):
                shadow.copy_(tc.tensor(array, dtype=shadow.dtype, device=shadow.device))

    def _matching(self, parameters: Iterable[Tensor], op: str) -> list[Tensor]:
        params = list(parameters)
        if len(params) != len(self.shadow_params):
            raise ValueError(f"EMAModel.{op}: got {len(params)} parameters, the average holds "
                             f"{len(self.shadow_params)}")
        for i, (p, shadow) in enumerate(zip(params, self.shadow_params)):
            if tuple(p.shape) != tuple(shadow.shape) or p.device != shadow.device:
                raise ValueError(f"EMAModel.{op}: parameter {i} is {tuple(p.shape)} on {p.device}, its average "
                                 f"{tuple(shadow.shape)} on {shadow.device}")
        return params
