"""DDIM (Song et al. 2020, "Denoising Diffusion Implicit Models"), as diffusers' ``DDIMScheduler``."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

import tensorcore as tc

from .base import FinalAlphaCumprod, SchedulerBase, check_pair, noise_source
from .config import register_to_config
from .output import SchedulerOutput
from .prediction import PREDICTION_TYPES, bound_original, like, predict_epsilon, predict_original
from .run import SchedulerRun, StepArgs, draw_noise
from .spacing import SPACINGS


class DDIMScheduler(FinalAlphaCumprod, SchedulerBase):
    """Deterministic (eta = 0) to fully stochastic (eta = 1) sampling with few steps.

    Config keys, defaults and results are diffusers'.  One addition:
    ``prev_timestep_from_schedule=True`` takes each step's target timestep from the run's
    timestep list and ends on ``final_alpha_cumprod``; diffusers (and the default here)
    steps to ``t - num_train_timesteps // num_inference_steps``, which for ``trailing``
    and ``linspace`` spacing lands between the schedule's timesteps.

    ``step(model_output, timestep, sample, eta=0.0, use_clipped_model_output=False,
    generator=None, variance_noise=None, return_dict=True)``.
    """

    _choices = {"beta_schedule": ("linear", "scaled_linear", "squaredcos_cap_v2"),
                "prediction_type": PREDICTION_TYPES, "timestep_spacing": SPACINGS}

    @register_to_config
    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.0001, beta_end: float = 0.02,
                 beta_schedule: str = "linear", trained_betas: list[float] | None = None, clip_sample: bool = True,
                 set_alpha_to_one: bool = True, steps_offset: int = 0, prediction_type: str = "epsilon",
                 thresholding: bool = False, dynamic_thresholding_ratio: float = 0.995,
                 clip_sample_range: float = 1.0, sample_max_value: float = 1.0,
                 timestep_spacing: str = "leading", rescale_betas_zero_snr: bool = False,
                 prev_timestep_from_schedule: bool = False) -> None:
        super().__init__()
        self._set_final_alpha_cumprod(set_alpha_to_one)

    def _prev_timestep(self, schedule: np.ndarray, position: int) -> int:
        """The timestep step ``position`` goes to (negative: past the end, to ``final_alpha_cumprod``)."""
        n = len(schedule)
        if self._config["prev_timestep_from_schedule"]:
            return int(schedule[position + 1]) if position + 1 < n else -1
        return int(schedule[position]) - self._config["num_train_timesteps"] // n

    def _step_table(self, schedule: np.ndarray, tables: dict[str, np.ndarray]) -> np.ndarray:
        """Per step: ᾱ at its timestep and at the one it goes to."""
        alpha_bar, final = self._host["alphas_cumprod"], self._host["final_alpha_cumprod"]
        rows = []
        for position, t in enumerate(schedule):
            prev = self._prev_timestep(schedule, position)
            rows.append((alpha_bar[int(t)], alpha_bar[prev] if prev >= 0 else final))
        return np.array(rows, dtype=np.float32).reshape(-1, 2)

    def _alpha_bars(self, device: str, t: int, prev: int) -> tuple[tc.Tensor, tc.Tensor]:
        """ᾱ at ``t`` and at ``prev`` as float32 0-d tensors on ``device``."""
        alpha_bar = self.tables.get("alphas_cumprod", device)
        prev_bar = alpha_bar[prev] if prev >= 0 else self.tables.get("final_alpha_cumprod", device)
        return alpha_bar[t], prev_bar

    def _variance(self, alpha_prod_t: tc.Tensor, alpha_prod_prev: tc.Tensor) -> tc.Tensor:
        """σ_t² of DDIM's eq. (16) at eta = 1: (1 - ᾱ_prev) / (1 - ᾱ_t) * (1 - ᾱ_t / ᾱ_prev)."""
        return ((1 - alpha_prod_prev) / (1 - alpha_prod_t)) * (1 - alpha_prod_t / alpha_prod_prev)

    def _get_variance(self, timestep: int, prev_timestep: int) -> tc.Tensor:
        """σ_t² between two timesteps (a float32 0-d CPU tensor), as diffusers' ``_get_variance``."""
        return self._variance(*self._alpha_bars("cpu", timestep, prev_timestep))

    def _step(self, run: SchedulerRun, model_output: tc.Tensor, timestep: Any, sample: tc.Tensor,
              eta: float = 0.0, use_clipped_model_output: bool = False, generator: tc.Generator | None = None,
              variance_noise: tc.Tensor | None = None, return_dict: bool = True) -> SchedulerOutput | tuple:
        check_pair("DDIMScheduler.step", sample, model_output, "model_output")
        return self._run_step(run, run._position(timestep, "DDIMScheduler.step"), model_output, sample,
                              return_dict, eta=eta, use_clipped_model_output=use_clipped_model_output,
                              generator=generator, variance_noise=variance_noise)

    def _prepare(self, run: SchedulerRun, position: int, sample: tc.Tensor, eta: float = 0.0,
                 use_clipped_model_output: bool = False, generator: tc.Generator | None = None,
                 variance_noise: tc.Tensor | None = None) -> StepArgs:
        op = "DDIMScheduler.step"
        if not isinstance(eta, numbers.Real) or not eta >= 0:
            raise ValueError(f"{op}: eta must be a float >= 0, got {eta!r}")
        noise = noise_source(op, sample, generator, variance_noise) if eta > 0 else None
        return StepArgs((float(eta), bool(use_clipped_model_output)), run.step_values(position, sample.device),
                        noise=noise)

    def step_update(self, args: StepArgs, model_output: tc.Tensor, sample: tc.Tensor) -> tuple[tc.Tensor, tc.Tensor]:
        eta, use_clipped_model_output = args.variant
        alpha_prod_t, alpha_prod_prev = args.values[0], args.values[1]
        beta_prod_t = 1 - alpha_prod_t
        std_dev_t = eta * self._variance(alpha_prod_t, alpha_prod_prev).sqrt()
        alpha, sigma = like(alpha_prod_t.sqrt(), sample), like(beta_prod_t.sqrt(), sample)

        # x̂₀ and ε̂ (DDIM eq. 12), x̂₀ clipped or thresholded
        kind = self._config["prediction_type"]
        original = predict_original(kind, model_output, sample, alpha, sigma)
        epsilon = predict_epsilon(kind, model_output, sample, alpha, sigma, original)
        original = bound_original(original, self._config)
        if use_clipped_model_output:  # ε̂ re-derived from the clipped x̂₀, as in GLIDE
            epsilon = (sample - alpha * original) / sigma

        direction = like((1 - alpha_prod_prev - std_dev_t * std_dev_t).sqrt(), sample) * epsilon
        prev_sample = like(alpha_prod_prev.sqrt(), sample) * original + direction
        if eta > 0:
            noise = draw_noise(args.noise, model_output, args.noise_dtype)
            prev_sample = prev_sample + like(std_dev_t, noise) * noise
        return prev_sample, original
