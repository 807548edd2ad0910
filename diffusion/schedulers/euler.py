"""Euler's method on the probability-flow ODE in σ (Karras et al. 2022, Algorithm 2), as
diffusers' ``EulerDiscreteScheduler``."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

import tensorcore as tc

from .base import SchedulerBase, check_pair, noise_source, timestep_tensor
from .config import register_to_config
from .output import SchedulerOutput
from .prediction import PREDICTION_TYPES, upcast
from .run import SchedulerRun, StepArgs, draw_noise
from .sigmas import exponential_sigmas, karras_sigmas, sigma_to_t, train_sigmas
from .spacing import SPACINGS, spaced_timesteps

F32 = np.float32


class EulerDiscreteScheduler(SchedulerBase):
    """Euler steps x ← x + (x - x̂₀) / σ · (σ_next - σ) over a σ schedule; the sample lives in
    σ-space (x = x₀ + σ ε), so the model input is scaled by 1 / sqrt(σ² + 1).

    Config keys, defaults and results are diffusers' (``use_beta_sigmas`` is not offered).
    Timesteps are float32, fractional for ``linspace`` spacing and Karras σ.  Deterministic
    unless ``s_churn`` > 0 (then noise comes from ``generator`` or ``variance_noise``).

    ``step(model_output, timestep, sample, s_churn=0.0, s_tmin=0.0, s_tmax=inf, s_noise=1.0,
    generator=None, variance_noise=None, return_dict=True)``.
    """

    timestep_dtype = np.float32
    _choices = {"beta_schedule": ("linear", "scaled_linear", "squaredcos_cap_v2"),
                "prediction_type": (*PREDICTION_TYPES, "original_sample"), "timestep_spacing": SPACINGS,
                "interpolation_type": ("linear", "log_linear"), "timestep_type": ("discrete", "continuous"),
                "final_sigmas_type": ("zero", "sigma_min"), "use_karras_sigmas": (False, True, None),
                "use_exponential_sigmas": (False, True, None), "use_beta_sigmas": (False, None)}

    @register_to_config
    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.0001, beta_end: float = 0.02,
                 beta_schedule: str = "linear", trained_betas: list[float] | None = None,
                 prediction_type: str = "epsilon", interpolation_type: str = "linear",
                 use_karras_sigmas: bool | None = False, use_exponential_sigmas: bool | None = False,
                 use_beta_sigmas: bool | None = False, sigma_min: float | None = None,
                 sigma_max: float | None = None, timestep_spacing: str = "linspace",
                 timestep_type: str = "discrete", steps_offset: int = 0, rescale_betas_zero_snr: bool = False,
                 final_sigmas_type: str = "zero") -> None:
        super().__init__()
        self._make_sigmas()

    def _make_sigmas(self) -> None:
        """σ of every training timestep (the last kept finite under a zero terminal SNR)."""
        if self._config["rescale_betas_zero_snr"]:
            self._host["alphas_cumprod"][-1] = 2.0 ** -24
        self._host["sigmas"] = train_sigmas(self._host["alphas_cumprod"])

    def _check_config(self, config: dict[str, Any]) -> None:
        if config.get("use_karras_sigmas") and config.get("use_exponential_sigmas"):
            raise ValueError("EulerDiscreteScheduler: only one of use_karras_sigmas and use_exponential_sigmas "
                             "can be True")

    @property
    def _euler_config(self) -> dict[str, Any]:
        """The config the σ schedule reads (subclasses with fewer keys fill in Euler's defaults)."""
        return self._config

    @property
    def _continuous(self) -> bool:
        """Timesteps are 0.25 log σ rather than training timesteps (EDM-style v-prediction)."""
        c = self._euler_config
        return c["timestep_type"] == "continuous" and c["prediction_type"] == "v_prediction"

    @property
    def sigmas(self) -> tc.Tensor:
        """The default run's σ schedule; before ``set_timesteps``, every training σ, largest first, and 0."""
        run = self._default_run
        return run.sigmas if run is not None else tc.tensor(self._training_sigmas())

    def _training_sigmas(self) -> np.ndarray:
        return np.concatenate([self._host["sigmas"][::-1], [F32(0)]]).astype(F32)

    def _training_timesteps(self) -> np.ndarray:
        if self._continuous:
            return F32(0.25) * np.log(self._host["sigmas"][::-1])
        return np.linspace(0, len(self) - 1, len(self))[::-1].astype(F32)

    # ----- schedule --------------------------------------------------------------------------
    def _schedule(self, num_inference_steps: int, timesteps: np.ndarray | None) -> tuple[np.ndarray, dict]:
        c, n, T = self._euler_config, num_inference_steps, self._config["num_train_timesteps"]
        if timesteps is not None and (c["use_karras_sigmas"] or c["use_exponential_sigmas"] or self._continuous):
            raise ValueError("EulerDiscreteScheduler.start: custom timesteps cannot be combined with "
                             "use_karras_sigmas, use_exponential_sigmas or continuous v-prediction timesteps")
        if timesteps is None:
            timesteps = spaced_timesteps(c["timestep_spacing"], T, n, c["steps_offset"], round_linspace=False)
        timesteps = timesteps.astype(F32)
        train = self._host["sigmas"]
        log_sigmas = np.log(train)
        if c["interpolation_type"] == "linear":
            sigmas = np.interp(timesteps, np.arange(T), train)
        else:  # log_linear: n + 1 σ even in log σ (as diffusers, one more σ than steps)
            points = np.linspace(np.log(train[-1]), np.log(train[0]), n + 1, dtype=np.float64).astype(F32)
            sigmas = np.exp(points)
        if c["use_karras_sigmas"] or c["use_exponential_sigmas"]:
            sigma_min = c["sigma_min"] if c["sigma_min"] is not None else sigmas[-1].item()
            sigma_max = c["sigma_max"] if c["sigma_max"] is not None else sigmas[0].item()
            spread = karras_sigmas if c["use_karras_sigmas"] else exponential_sigmas
            sigmas = spread(sigma_min, sigma_max, n)
            timesteps = sigma_to_t(sigmas, log_sigmas)
        alphas_cumprod = self._host["alphas_cumprod"]
        final = 0.0 if c["final_sigmas_type"] == "zero" else np.sqrt((1 - alphas_cumprod[0]) / alphas_cumprod[0])
        sigmas = np.concatenate([sigmas, [final]]).astype(F32)
        if self._continuous:
            timesteps = F32(0.25) * np.log(sigmas[:-1])
        return timesteps.astype(F32), {"sigmas": sigmas}

    def _init_noise_sigma(self, run: SchedulerRun | None) -> float:
        sigma = (run.tables.host["sigmas"] if run is not None else self._training_sigmas()).max()
        if self._config["timestep_spacing"] in ("linspace", "trailing"):
            return float(sigma)
        return float(np.sqrt(sigma * sigma + F32(1)))

    # ----- the forward process in σ-space ------------------------------------------------------
    def _sigma_at(self, timesteps: Any, x: tc.Tensor, noise: tc.Tensor, op: str) -> tc.Tensor:
        """σ of each timestep, shaped to broadcast over x."""
        if not self._continuous:
            return self._at_timesteps("sigmas", timesteps, x, noise, op)
        check_pair(op, x, noise, "noise")
        t = timestep_tensor(timesteps, x, op).to(x.dtype)
        return (t * 4).exp().reshape((-1,) + (1,) * (x.ndim - 1))

    def add_noise(self, original_samples: tc.Tensor, noise: tc.Tensor, timesteps: Any) -> tc.Tensor:
        """x = x₀ + σ_t ε (σ-space), one timestep per batch item (or one for all)."""
        return original_samples + noise * self._sigma_at(timesteps, original_samples, noise, "add_noise")

    def get_velocity(self, sample: tc.Tensor, noise: tc.Tensor, timesteps: Any) -> tc.Tensor:
        """v = sqrt(ᾱ) ε - sqrt(1 - ᾱ) x₀ at each timestep's noise level, ᾱ = 1 / (σ² + 1)."""
        sigma = self._sigma_at(timesteps, sample, noise, "get_velocity")
        alpha = 1 / (sigma * sigma + 1).sqrt()
        return alpha * noise - (sigma * alpha) * sample

    def _add_noise_at(self, run: SchedulerRun, original_samples: tc.Tensor, noise: tc.Tensor) -> tc.Tensor:
        check_pair("add_noise", original_samples, noise, "noise")
        sigma = run.tables.get("sigmas", original_samples.device, original_samples.dtype)[run.position]
        return original_samples + noise * sigma

    # ----- step ------------------------------------------------------------------------------
    def _step_table(self, schedule: np.ndarray, tables: dict[str, np.ndarray]) -> np.ndarray:
        """Per step i: σ[i] and σ[i + 1]."""
        sigmas = tables["sigmas"]
        return np.stack([sigmas[:-1], sigmas[1:]], axis=1)

    def _scale_model_input(self, run: SchedulerRun | None, sample: tc.Tensor, timestep: Any) -> tc.Tensor:
        """sample / sqrt(σ² + 1): the model sees unit-variance input."""
        run = run if run is not None else self._run("scale_model_input")
        i = run._position(timestep, "EulerDiscreteScheduler.scale_model_input")
        run.input_scaled = True
        return _scaled(sample, run.step_values(i, sample.device)[0])

    def step_input(self, args: StepArgs, sample: tc.Tensor) -> tc.Tensor:
        return _scaled(sample, args.values[0])

    def _step(self, run: SchedulerRun, model_output: tc.Tensor, timestep: Any, sample: tc.Tensor,
              s_churn: float = 0.0, s_tmin: float = 0.0, s_tmax: float = float("inf"), s_noise: float = 1.0,
              generator: tc.Generator | None = None, variance_noise: tc.Tensor | None = None,
              return_dict: bool = True) -> SchedulerOutput | tuple:
        i = self._step_position(run, "EulerDiscreteScheduler.step", model_output, timestep, sample)
        return self._run_step(run, i, model_output, sample, return_dict, s_churn=s_churn, s_tmin=s_tmin,
                              s_tmax=s_tmax, s_noise=s_noise, generator=generator, variance_noise=variance_noise)

    @staticmethod
    def _step_position(run: SchedulerRun, op: str, model_output: tc.Tensor, timestep: Any, sample: tc.Tensor) -> int:
        """The position of ``timestep`` in ``run`` once a step's inputs are checked (a
        warning when the model input was not scaled first)."""
        check_pair(op, sample, model_output, "model_output")
        i = run._position(timestep, op)
        if not run.input_scaled:
            warnings.warn(f"{op}: call scale_model_input before step for a correct model input",
                          UserWarning, stacklevel=4)
        return i

    def _prepare(self, run: SchedulerRun, position: int, sample: tc.Tensor, s_churn: float = 0.0,
                 s_tmin: float = 0.0, s_tmax: float = float("inf"), s_noise: float = 1.0,
                 generator: tc.Generator | None = None, variance_noise: tc.Tensor | None = None) -> StepArgs:
        op = "EulerDiscreteScheduler.step"
        if not s_churn >= 0:
            raise ValueError(f"{op}: s_churn must be >= 0, got {s_churn!r}")
        host_sigmas = run.tables.host["sigmas"]
        # "churn": raise σ by a factor 1 + gamma with fresh noise (Karras et al. 2022, Algorithm 2)
        gamma = 0.0
        if s_tmin <= host_sigmas[position] <= s_tmax:
            gamma = min(s_churn / (len(host_sigmas) - 1), 2 ** 0.5 - 1)
        noise = noise_source(op, sample, generator, variance_noise) if gamma > 0 else None
        return StepArgs((float(gamma), float(s_noise) if gamma > 0 else 1.0), run.step_values(position, sample.device),
                        noise=noise)

    def step_update(self, args: StepArgs, model_output: tc.Tensor, sample: tc.Tensor) -> tuple[tc.Tensor, tc.Tensor]:
        gamma, s_noise = args.variant
        sigma, sigma_next = args.values[0], args.values[1]
        sigma_hat = sigma * (gamma + 1)
        sample = upcast(sample)
        if gamma > 0:
            eps = draw_noise(args.noise, model_output, args.noise_dtype) * s_noise
            sample = sample + eps * (sigma_hat * sigma_hat - sigma * sigma).sqrt()
        original = sigma_original(self._config["prediction_type"], model_output, sample, sigma, sigma_hat)
        derivative = (sample - original) / sigma_hat
        prev_sample = (sample + derivative * (sigma_next - sigma_hat)).to(model_output.dtype)
        return prev_sample, original


def sigma_original(kind: str, model_output: tc.Tensor, sample: tc.Tensor, sigma: tc.Tensor,
                   sigma_hat: tc.Tensor) -> tc.Tensor:
    """x̂₀ of a σ-space sample (x = x₀ + σ ε) at σ (raised to ``sigma_hat`` by churn, for ε)."""
    if kind in ("sample", "original_sample"):
        return model_output
    if kind == "epsilon":
        return sample - sigma_hat * model_output
    return model_output * (-sigma / (sigma * sigma + 1).sqrt()) + sample / (sigma * sigma + 1)  # v_prediction


def _scaled(sample: tc.Tensor, sigma: tc.Tensor) -> tc.Tensor:
    """sample / sqrt(σ² + 1)."""
    return sample / (sigma * sigma + 1).sqrt().to(sample.dtype)
