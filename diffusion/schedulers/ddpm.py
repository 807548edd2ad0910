"""DDPM (Ho et al. 2020, "Denoising Diffusion Probabilistic Models"), as diffusers' ``DDPMScheduler``."""

from __future__ import annotations

from typing import Any

import numpy as np

import tensorcore as tc

from .base import SchedulerBase, check_pair, noise_source
from .config import register_to_config
from .output import SchedulerOutput
from .prediction import PREDICTION_TYPES, bound_original, like, predict_original
from .run import SchedulerRun, StepArgs, draw_noise, host_value
from .spacing import SPACINGS

VARIANCE_TYPES = ("fixed_small", "fixed_small_log", "fixed_large", "fixed_large_log", "learned", "learned_range")


class DDPMScheduler(SchedulerBase):
    """Ancestral sampling of the posterior q(x_{t-1} | x_t, x̂₀), with noise at every step but the last.

    Config keys, defaults and results are diffusers'.  ``step`` also works without
    ``set_timesteps`` (over every training timestep, t to t - 1), as in diffusers.
    ``variance_type="fixed_large_log"`` gives the standard deviation sqrt(β_t) (diffusers
    takes the square root of log β_t there, which is NaN); ``variance_type=None`` (which a
    DPM-Solver config may carry) is ``fixed_small``, as in diffusers.

    ``step(model_output, timestep, sample, generator=None, variance_noise=None,
    return_dict=True)``; with a ``learned``/``learned_range`` variance the model output
    holds the predicted variance in its second half of channels.
    """

    _choices = {"beta_schedule": ("linear", "scaled_linear", "squaredcos_cap_v2", "sigmoid", "laplace"),
                "prediction_type": PREDICTION_TYPES, "timestep_spacing": SPACINGS,
                "variance_type": (*VARIANCE_TYPES, None)}

    @register_to_config
    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.0001, beta_end: float = 0.02,
                 beta_schedule: str = "linear", trained_betas: list[float] | None = None,
                 variance_type: str = "fixed_small", clip_sample: bool = True, prediction_type: str = "epsilon",
                 thresholding: bool = False, dynamic_thresholding_ratio: float = 0.995,
                 clip_sample_range: float = 1.0, sample_max_value: float = 1.0,
                 timestep_spacing: str = "leading", steps_offset: int = 0,
                 rescale_betas_zero_snr: bool = False) -> None:
        super().__init__()
        self._host["one"] = np.asarray(1.0, dtype=np.float32)

    def step(self, model_output: tc.Tensor, timestep: Any, sample: tc.Tensor, *args: Any,
             **kwargs: Any) -> SchedulerOutput | tuple:
        """One step of the default run, or from t to t - 1 when no timesteps were set."""
        return self._step(self._default_run, model_output, timestep, sample, *args, **kwargs)

    def _alpha_bars(self, device: str, t: int, prev: int) -> tuple[tc.Tensor, tc.Tensor]:
        alpha_bar = self.tables.get("alphas_cumprod", device)
        return alpha_bar[t], alpha_bar[prev] if prev >= 0 else self.tables.get("one", device)

    def _step_table(self, schedule: np.ndarray, tables: dict[str, np.ndarray]) -> np.ndarray:
        """Per step: ᾱ at its timestep and at the next one of the run (1 after the last)."""
        alpha_bar = self._host["alphas_cumprod"]
        prev = [alpha_bar[int(t)] for t in schedule[1:]] + [self._host["one"]]
        return np.array([(alpha_bar[int(t)], p) for t, p in zip(schedule, prev)], dtype=np.float32).reshape(-1, 2)

    def _get_variance(self, t: int, prev_t: int | None = None, predicted_variance: tc.Tensor | None = None,
                      device: str = "cpu") -> tc.Tensor:
        """The posterior's variance at ``t`` as ``variance_type`` says (a std for the ``*_log`` /
        ``learned_range`` types, a log for ``fixed_large_log``), as diffusers' ``_get_variance``."""
        return self._variance(*self._alpha_bars(device, t, t - 1 if prev_t is None else prev_t), predicted_variance)

    def _variance(self, alpha_prod_t: tc.Tensor, alpha_prod_prev: tc.Tensor,
                  predicted_variance: tc.Tensor | None) -> tc.Tensor:
        """``_get_variance`` between the noise levels ᾱ_t and ᾱ_prev."""
        current_beta_t = 1 - alpha_prod_t / alpha_prod_prev
        # β̃_t = (1 - ᾱ_{t-1}) / (1 - ᾱ_t) β_t (DDPM eq. 7), kept from 0 so its log is finite
        variance = ((1 - alpha_prod_prev) / (1 - alpha_prod_t) * current_beta_t).clip(1e-20, None)
        kind = self._config["variance_type"]
        if kind == "fixed_small_log":
            return (0.5 * variance.log()).exp()
        if kind == "fixed_large":
            return current_beta_t
        if kind == "fixed_large_log":
            return current_beta_t.log()
        if kind == "learned":
            return predicted_variance
        if kind == "learned_range":
            fraction = (predicted_variance + 1) / 2
            return fraction * like(current_beta_t.log(), fraction) + (1 - fraction) * like(variance.log(), fraction)
        return variance

    def _noise_scale(self, alpha_prod_t: tc.Tensor, alpha_prod_prev: tc.Tensor,
                     predicted_variance: tc.Tensor | None) -> tc.Tensor:
        """The standard deviation of the noise added at ᾱ_t."""
        variance = self._variance(alpha_prod_t, alpha_prod_prev, predicted_variance)
        kind = self._config["variance_type"]
        if kind == "fixed_small_log":
            return variance
        if kind in ("fixed_large_log", "learned_range"):
            return (0.5 * variance).exp()
        return variance.sqrt()

    def _training_timestep(self, timestep: Any, op: str) -> int:
        """The value of a timestep stepped without a run: a whole number in [0, T)."""
        value = host_value(timestep, op)
        if value is None:
            raise ValueError(f"{op}: without set_timesteps the timestep must be a number or a CPU tensor")
        if value != int(value) or not 0 <= value < len(self):
            raise ValueError(f"{op}: timestep must be a whole number in [0, {len(self)}), got {value}")
        return int(value)

    def _split(self, model_output: tc.Tensor, sample: tc.Tensor) -> tuple[tc.Tensor, tc.Tensor | None]:
        """(the prediction, the predicted variance): a learned variance is the second half of
        the model output's channels."""
        learned = self._config["variance_type"] in ("learned", "learned_range")
        channels = sample.shape[1] if isinstance(sample, tc.Tensor) and sample.ndim > 1 else None
        if learned and isinstance(model_output, tc.Tensor) and channels and model_output.shape[1] == 2 * channels:
            return model_output[:, :channels], model_output[:, channels:]
        return model_output, None

    def _step(self, run: SchedulerRun | None, model_output: tc.Tensor, timestep: Any, sample: tc.Tensor,
              generator: tc.Generator | None = None, variance_noise: tc.Tensor | None = None,
              return_dict: bool = True) -> SchedulerOutput | tuple:
        op = "DDPMScheduler.step"
        output, predicted_variance = self._split(model_output, sample)
        check_pair(op, sample, output, "model_output")
        if self._config["variance_type"] in ("learned", "learned_range") and predicted_variance is None:
            raise ValueError(f"{op}: variance_type {self._config['variance_type']!r} needs a model output of "
                             f"2 x {sample.shape[1]} channels (the variance second), got shape {model_output.shape}")
        if run is not None:
            return self._run_step(run, run._position(timestep, op), model_output, sample, return_dict,
                                  generator=generator, variance_noise=variance_noise)
        # no timesteps set: every training timestep, t -> t - 1
        t = self._training_timestep(timestep, op)
        values = tc.stack(list(self._alpha_bars(sample.device, t, t - 1)))
        prev_sample, original = self.step_update(self._args(t > 0, values, sample, generator, variance_noise),
                                                 model_output, sample)
        out = SchedulerOutput(prev_sample, original)
        return out if return_dict else out.to_tuple()

    def _prepare(self, run: SchedulerRun, position: int, sample: tc.Tensor, generator: tc.Generator | None = None,
                 variance_noise: tc.Tensor | None = None) -> StepArgs:
        return self._args(run.timestep_at(position) > 0, run.step_values(position, sample.device), sample,
                          generator, variance_noise)

    def _args(self, noisy: bool, values: tc.Tensor, sample: tc.Tensor, generator: tc.Generator | None,
              variance_noise: tc.Tensor | None) -> StepArgs:
        """A step's arguments: noise is added at every timestep but 0."""
        noise = noise_source("DDPMScheduler.step", sample, generator, variance_noise) if noisy else None
        return StepArgs((bool(noisy),), values, noise=noise)

    def step_update(self, args: StepArgs, model_output: tc.Tensor, sample: tc.Tensor) -> tuple[tc.Tensor, tc.Tensor]:
        model_output, predicted_variance = self._split(model_output, sample)
        alpha_prod_t, alpha_prod_prev = args.values[0], args.values[1]
        beta_prod_t, beta_prod_prev = 1 - alpha_prod_t, 1 - alpha_prod_prev
        current_alpha_t = alpha_prod_t / alpha_prod_prev
        current_beta_t = 1 - current_alpha_t
        original = predict_original(self._config["prediction_type"], model_output, sample,
                                    like(alpha_prod_t.sqrt(), sample), like(beta_prod_t.sqrt(), sample))
        original = bound_original(original, self._config)

        # mean of q(x_{t-1} | x_t, x̂₀) (DDPM eq. 7)
        original_coeff = alpha_prod_prev.sqrt() * current_beta_t / beta_prod_t
        sample_coeff = current_alpha_t.sqrt() * beta_prod_prev / beta_prod_t
        prev_sample = like(original_coeff, sample) * original + like(sample_coeff, sample) * sample
        if args.variant[0]:
            noise = draw_noise(args.noise, model_output, args.noise_dtype)
            scale = self._noise_scale(alpha_prod_t, alpha_prod_prev, predicted_variance)
            prev_sample = prev_sample + like(scale, noise) * noise
        return prev_sample, original
