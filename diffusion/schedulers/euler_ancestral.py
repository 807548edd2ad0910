"""Euler's method with ancestral sampling (Karras et al. 2022's "Euler a"), as diffusers'
``EulerAncestralDiscreteScheduler``."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

import tensorcore as tc

from .base import SchedulerBase, check_pair, noise_source
from .config import register_to_config
from .euler import EulerDiscreteScheduler, sigma_original
from .output import SchedulerOutput
from .prediction import upcast
from .run import SchedulerRun, StepArgs, draw_noise
from .spacing import SPACINGS

F32 = np.float32


class EulerAncestralDiscreteScheduler(EulerDiscreteScheduler):
    """Each step goes down to σ_down by an Euler step and adds fresh noise of size σ_up, where
    σ_down² + σ_up² = σ_next² (the ancestral split of the move from σ to σ_next).

    Config keys, defaults and results are diffusers'; the σ schedule and model-input
    scaling are ``EulerDiscreteScheduler``'s (linear interpolation, no Karras σ).  The
    noise comes from ``generator`` (the device's default generator when None) or is
    given as ``variance_noise``.

    ``step(model_output, timestep, sample, generator=None, variance_noise=None, return_dict=True)``.
    """

    _choices = {"beta_schedule": ("linear", "scaled_linear", "squaredcos_cap_v2"),
                "prediction_type": ("epsilon", "v_prediction"), "timestep_spacing": SPACINGS}

    @register_to_config
    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.0001, beta_end: float = 0.02,
                 beta_schedule: str = "linear", trained_betas: list[float] | None = None,
                 prediction_type: str = "epsilon", timestep_spacing: str = "linspace", steps_offset: int = 0,
                 rescale_betas_zero_snr: bool = False) -> None:
        SchedulerBase.__init__(self)  # (Euler's __init__ would record Euler's config keys)
        self._make_sigmas()

    @property
    def _euler_config(self) -> dict[str, Any]:
        return {**EulerDiscreteScheduler.config_defaults(), **self._config}

    def _step_table(self, schedule: np.ndarray, tables: dict[str, np.ndarray]) -> np.ndarray:
        """Per step i: σ[i], σ[i + 1], σ_up and σ_down (float32, as diffusers computes them)."""
        sigma, sigma_to = tables["sigmas"][:-1].astype(F32), tables["sigmas"][1:].astype(F32)
        sigma_up = np.sqrt(sigma_to ** 2 * (sigma ** 2 - sigma_to ** 2) / sigma ** 2)
        sigma_down = np.sqrt(sigma_to ** 2 - sigma_up ** 2)
        return np.stack([sigma, sigma_to, sigma_up, sigma_down], axis=1)

    def _step(self, run: SchedulerRun, model_output: tc.Tensor, timestep: Any, sample: tc.Tensor,
              generator: tc.Generator | None = None, variance_noise: tc.Tensor | None = None,
              return_dict: bool = True) -> SchedulerOutput | tuple:
        i = self._step_position(run, "EulerAncestralDiscreteScheduler.step", model_output, timestep, sample)
        return self._run_step(run, i, model_output, sample, return_dict, generator=generator,
                              variance_noise=variance_noise)

    def _prepare(self, run: SchedulerRun, position: int, sample: tc.Tensor, generator: tc.Generator | None = None,
                 variance_noise: tc.Tensor | None = None) -> StepArgs:
        noise = noise_source("EulerAncestralDiscreteScheduler.step", sample, generator, variance_noise)
        return StepArgs((), run.step_values(position, sample.device), noise=noise)

    def step_update(self, args: StepArgs, model_output: tc.Tensor, sample: tc.Tensor) -> tuple[tc.Tensor, tc.Tensor]:
        sigma, sigma_up, sigma_down = args.values[0], args.values[2], args.values[3]
        sample = upcast(sample)
        original = sigma_original(self._config["prediction_type"], model_output, sample, sigma, sigma)
        prev_sample = sample + (sample - original) / sigma * (sigma_down - sigma)
        noise = draw_noise(args.noise, model_output, args.noise_dtype)
        return (prev_sample + noise * sigma_up).to(model_output.dtype), original
