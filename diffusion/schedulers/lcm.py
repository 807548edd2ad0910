"""Latent consistency models' multistep sampling (Luo et al. 2023), as diffusers' ``LCMScheduler``."""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np

import tensorcore as tc

from .base import FinalAlphaCumprod, SchedulerBase, check_pair, noise_source
from .config import register_to_config
from .output import LCMSchedulerOutput, SchedulerOutput
from .prediction import PREDICTION_TYPES, bound_original, like, predict_original
from .run import SchedulerRun, StepArgs, draw_noise
from .spacing import SPACINGS

SIGMA_DATA = 0.5  # the consistency model's data standard deviation (its boundary condition)


class LCMScheduler(FinalAlphaCumprod, SchedulerBase):
    """A few consistency steps: each maps x_t to a clean estimate (denoised = c_skip x_t +
    c_out x̂₀, the boundary-condition scalings) and, except the last, noises it afresh to
    the next timestep.

    Config keys, defaults and results are diffusers'.  The timesteps are a subset of the
    ``original_inference_steps`` timesteps the model was distilled on (``timestep_spacing``
    and ``steps_offset`` are kept for config compatibility and, as in diffusers, unused).
    The noise between steps comes from ``generator`` or ``variance_noise``.  The UNet's
    ``timestep_cond`` (``time_cond_proj_dim``) is ``get_guidance_scale_embedding(w - 1)``.

    ``start(num_inference_steps=None, device=None, original_inference_steps=None,
    timesteps=None, strength=1.0)``; ``step(model_output, timestep, sample, generator=None,
    variance_noise=None, return_dict=True)`` returns ``prev_sample`` and ``denoised``.
    """

    output_type = LCMSchedulerOutput
    schedule_options = ("original_inference_steps", "strength")
    _choices = {"beta_schedule": ("linear", "scaled_linear", "squaredcos_cap_v2"),
                "prediction_type": PREDICTION_TYPES, "timestep_spacing": SPACINGS}

    @register_to_config
    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.00085, beta_end: float = 0.012,
                 beta_schedule: str = "scaled_linear", trained_betas: list[float] | None = None,
                 original_inference_steps: int = 50, clip_sample: bool = False, clip_sample_range: float = 1.0,
                 set_alpha_to_one: bool = True, steps_offset: int = 0, prediction_type: str = "epsilon",
                 thresholding: bool = False, dynamic_thresholding_ratio: float = 0.995,
                 sample_max_value: float = 1.0, timestep_spacing: str = "leading", timestep_scaling: float = 10.0,
                 rescale_betas_zero_snr: bool = False) -> None:
        super().__init__()
        self._set_final_alpha_cumprod(set_alpha_to_one)

    def _check_config(self, config: dict[str, Any]) -> None:
        if config["original_inference_steps"] > config["num_train_timesteps"]:
            raise ValueError(f"LCMScheduler: original_inference_steps ({config['original_inference_steps']}) "
                             f"cannot be larger than num_train_timesteps ({config['num_train_timesteps']})")

    # ----- schedule --------------------------------------------------------------------------
    def start(self, num_inference_steps: int | None = None, device: str | None = None,
              original_inference_steps: int | None = None, timesteps: Sequence[int] | None = None,
              strength: float = 1.0) -> SchedulerRun:
        """A new run (diffusers' ``set_timesteps`` arguments, in its order); ``strength`` < 1
        keeps the lower part of the schedule (image-to-image)."""
        return super().start(num_inference_steps, device, timesteps,
                             original_inference_steps=original_inference_steps, strength=strength)

    def set_timesteps(self, num_inference_steps: int | None = None, device: str | None = None,
                      original_inference_steps: int | None = None, timesteps: Sequence[int] | None = None,
                      strength: float = 1.0) -> None:
        """Start the default run that ``step`` drives (diffusers' arguments, in its order)."""
        self._default_run = self.start(num_inference_steps, device, original_inference_steps, timesteps, strength)

    def _schedule(self, num_inference_steps: int, timesteps: np.ndarray | None,
                  original_inference_steps: int | None = None, strength: float = 1.0) -> tuple[np.ndarray, dict]:
        name, c, n = "LCMScheduler.start", self._config, num_inference_steps
        original = c["original_inference_steps"] if original_inference_steps is None else original_inference_steps
        if not isinstance(original, numbers.Integral) or isinstance(original, bool) \
                or not 1 <= original <= c["num_train_timesteps"]:
            raise ValueError(f"{name}: original_inference_steps must be an int in [1, {c['num_train_timesteps']}], "
                             f"got {original!r}")
        if isinstance(strength, bool) or not isinstance(strength, numbers.Real) or not 0 < strength <= 1:
            raise ValueError(f"{name}: strength must be a float in (0, 1], got {strength!r}")
        if timesteps is not None:  # as diffusers: the first (1 - strength) of them are skipped
            start = max(n - min(int(n * strength), n), 0)
            return timesteps[start:], {}
        # the distillation schedule: every k-th training timestep, k = T // original, ending on k - 1
        k = c["num_train_timesteps"] // original
        distilled = (np.arange(1, int(original * strength) + 1) * k - 1)[::-1]
        if n > original or len(distilled) // n < 1:
            raise ValueError(f"{name}: num_inference_steps ({n}) must be at most original_inference_steps x "
                             f"strength ({original} x {strength} = {len(distilled)} timesteps)")
        return distilled[np.floor(np.linspace(0, len(distilled), num=n, endpoint=False)).astype(np.int64)], {}

    def _step_table(self, schedule: np.ndarray, tables: dict[str, np.ndarray]) -> np.ndarray:
        """Per step: ᾱ at its timestep and the next (the last step's next is itself), c_skip, c_out."""
        alpha_bar = self._host["alphas_cumprod"]
        t = schedule.astype(np.int64)
        scaled = t.astype(np.float32) * np.float32(self._config["timestep_scaling"])
        denominator = scaled * scaled + np.float32(SIGMA_DATA ** 2)
        c_skip = np.float32(SIGMA_DATA ** 2) / denominator
        c_out = scaled / np.sqrt(denominator)
        return np.stack([alpha_bar[t], alpha_bar[np.append(t[1:], t[-1:])], c_skip, c_out], axis=1)

    # ----- step ------------------------------------------------------------------------------
    def _step(self, run: SchedulerRun, model_output: tc.Tensor, timestep: Any, sample: tc.Tensor,
              generator: tc.Generator | None = None, variance_noise: tc.Tensor | None = None,
              return_dict: bool = True) -> SchedulerOutput | tuple:
        op = "LCMScheduler.step"
        check_pair(op, sample, model_output, "model_output")
        return self._run_step(run, run._position(timestep, op), model_output, sample, return_dict,
                              generator=generator, variance_noise=variance_noise)

    def _prepare(self, run: SchedulerRun, position: int, sample: tc.Tensor, generator: tc.Generator | None = None,
                 variance_noise: tc.Tensor | None = None) -> StepArgs:
        last = position == run.num_inference_steps - 1
        noise = None if last else noise_source("LCMScheduler.step", sample, generator, variance_noise)
        return StepArgs((not last,), run.step_values(position, sample.device), noise=noise)

    def step_update(self, args: StepArgs, model_output: tc.Tensor, sample: tc.Tensor) -> tuple[tc.Tensor, tc.Tensor]:
        """(x at the next timestep, denoised): denoised re-noised to the next ᾱ (the last step: denoised)."""
        alpha_prod_t, alpha_prod_prev = args.values[0], args.values[1]
        c_skip, c_out = like(args.values[2], sample), like(args.values[3], sample)
        alpha, sigma = like(alpha_prod_t.sqrt(), sample), like((1 - alpha_prod_t).sqrt(), sample)
        original = bound_original(predict_original(self._config["prediction_type"], model_output, sample,
                                                   alpha, sigma), self._config)
        denoised = c_out * original + c_skip * sample
        if not args.variant[0]:
            return denoised, denoised
        noise = draw_noise(args.noise, denoised, args.noise_dtype)
        prev_sample = like(alpha_prod_prev.sqrt(), denoised) * denoised \
            + like((1 - alpha_prod_prev).sqrt(), denoised) * noise
        return prev_sample, denoised
