"""DPM-Solver++ multistep (Lu et al. 2022), as diffusers' ``DPMSolverMultistepScheduler``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import tensorcore as tc

from .base import SchedulerBase, check_pair, noise_source
from .config import register_to_config
from .output import SchedulerOutput
from .prediction import PREDICTION_TYPES, dynamic_threshold, like, predict_original, upcast
from .run import SchedulerRun, StepArgs, draw_noise
from .sigmas import exponential_sigmas, karras_sigmas, sigma_to_t, train_sigmas
from .spacing import SPACINGS

# schedulers whose configs name these values: diffusers reads them as the ones mapped to
_ALGORITHM_ALIASES = {"deis": "dpmsolver++"}
_SOLVER_TYPE_ALIASES = {"logrho": "midpoint", "bh1": "midpoint", "bh2": "midpoint"}


class DPMSolverMultistepScheduler(SchedulerBase):
    """DPM-Solver++ 1M/2M/3M and its SDE variant: a multistep exponential integrator in x̂₀.

    Config keys, defaults and results are diffusers' (``algorithm_type`` ``dpmsolver++``
    or ``sde-dpmsolver++``; ``use_beta_sigmas``, flow sigmas and dynamic shifting are not
    offered).  Steps go by position in the run, so schedules that repeat a timestep
    (``use_karras_sigmas`` on ``squaredcos_cap_v2``) step through every σ, where
    diffusers' search of the timestep list runs off its end.

    ``step(model_output, timestep, sample, generator=None, variance_noise=None,
    return_dict=True)``; the noise is used by ``sde-dpmsolver++`` only.
    """

    solver_history = True
    _unrounded_schedules: tuple[str, ...] = ("squaredcos_cap_v2",)  # Karras / λ timesteps kept fractional
    _choices = {"beta_schedule": ("linear", "scaled_linear", "squaredcos_cap_v2"),
                "prediction_type": PREDICTION_TYPES, "timestep_spacing": SPACINGS, "solver_order": (1, 2, 3),
                "algorithm_type": ("dpmsolver++", "sde-dpmsolver++", *_ALGORITHM_ALIASES),
                "solver_type": ("midpoint", "heun", *_SOLVER_TYPE_ALIASES),
                "final_sigmas_type": ("zero", "sigma_min"),
                "use_beta_sigmas": (False,), "use_flow_sigmas": (False,), "use_dynamic_shifting": (False,),
                "time_shift_type": ("exponential",)}

    @register_to_config
    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.0001, beta_end: float = 0.02,
                 beta_schedule: str = "linear", trained_betas: list[float] | None = None, solver_order: int = 2,
                 prediction_type: str = "epsilon", thresholding: bool = False,
                 dynamic_thresholding_ratio: float = 0.995, sample_max_value: float = 1.0,
                 algorithm_type: str = "dpmsolver++", solver_type: str = "midpoint", lower_order_final: bool = True,
                 euler_at_final: bool = False, use_karras_sigmas: bool = False,
                 use_exponential_sigmas: bool = False, use_beta_sigmas: bool = False, use_lu_lambdas: bool = False,
                 use_flow_sigmas: bool = False, flow_shift: float = 1.0, final_sigmas_type: str = "zero",
                 lambda_min_clipped: float = -math.inf, variance_type: str | None = None,
                 timestep_spacing: str = "linspace", steps_offset: int = 0, rescale_betas_zero_snr: bool = False,
                 use_dynamic_shifting: bool = False, time_shift_type: str = "exponential") -> None:
        super().__init__()
        self._config["algorithm_type"] = _ALGORITHM_ALIASES.get(algorithm_type, algorithm_type)
        self._config["solver_type"] = _SOLVER_TYPE_ALIASES.get(solver_type, solver_type)
        self._make_sigmas()

    def _make_sigmas(self) -> None:
        """σ and λ of every training timestep (the last σ kept finite under a zero terminal SNR)."""
        alphas_cumprod = self._host["alphas_cumprod"]
        if self._config["rescale_betas_zero_snr"]:
            alphas_cumprod[-1] = 2.0 ** -24
        self._host["sigmas"] = train_sigmas(alphas_cumprod)
        with np.errstate(divide="ignore"):
            self._lambda_t = np.log(np.sqrt(alphas_cumprod)) - np.log(np.sqrt(1 - alphas_cumprod))

    @property
    def _dpm_config(self) -> dict[str, Any]:
        """The config the σ schedule reads (subclasses with fewer keys fill in these defaults)."""
        return self._config

    def _check_config(self, config: dict[str, Any]) -> None:
        chosen = [k for k in ("use_karras_sigmas", "use_exponential_sigmas", "use_lu_lambdas") if config.get(k)]
        if len(chosen) > 1:
            raise ValueError(f"{type(self).__name__}: only one of {chosen} can be True")

    @property
    def sigmas(self) -> tc.Tensor:
        """The default run's σ schedule; before ``set_timesteps``, σ of every training timestep."""
        run = self._default_run
        return run.sigmas if run is not None else tc.tensor(self._host["sigmas"])

    # ----- schedule --------------------------------------------------------------------------
    def _spaced(self, n: int) -> np.ndarray:
        """diffusers' N + 1-point spacing with the last point dropped, below ``lambda_min_clipped``."""
        c, T = self._dpm_config, self._config["num_train_timesteps"]
        last = T - int(np.searchsorted(np.flip(self._lambda_t), c["lambda_min_clipped"]))
        if c["timestep_spacing"] == "linspace":
            return np.linspace(0, last - 1, n + 1).round()[::-1][:-1].copy()
        if c["timestep_spacing"] == "leading":
            return (np.arange(0, n + 1) * (last // (n + 1))).round()[::-1][:-1] + c["steps_offset"]
        return (np.arange(last, 0, -T / n).round() - 1)[:n]

    def _schedule(self, num_inference_steps: int, timesteps: np.ndarray | None) -> tuple[np.ndarray, dict]:
        c, n = self._dpm_config, num_inference_steps
        custom_sigmas = c["use_karras_sigmas"] or c["use_lu_lambdas"] or c["use_exponential_sigmas"]
        if timesteps is not None and custom_sigmas:
            raise ValueError(f"{type(self).__name__}.start: custom timesteps cannot be combined with "
                             "use_karras_sigmas, use_lu_lambdas or use_exponential_sigmas")
        train = self._host["sigmas"]
        log_sigmas = np.log(train)
        sigma_min = c["sigma_min"] if c.get("sigma_min") is not None else train[0].item()
        sigma_max = c["sigma_max"] if c.get("sigma_max") is not None else train[-1].item()
        if c["use_karras_sigmas"]:
            sigmas = karras_sigmas(sigma_min, sigma_max, n)
        elif c["use_lu_lambdas"]:  # even in λ = -log σ
            lambda_min, lambda_max = log_sigmas[0].item(), log_sigmas[-1].item()
            sigmas = np.exp(lambda_max + np.linspace(0, 1, n) * (lambda_min - lambda_max))
        elif c["use_exponential_sigmas"]:
            sigmas = exponential_sigmas(sigma_min, sigma_max, n)
        if custom_sigmas:
            timesteps = sigma_to_t(sigmas, log_sigmas)
            if c["beta_schedule"] not in self._unrounded_schedules and not c["use_exponential_sigmas"]:
                timesteps = timesteps.round()
        else:
            timesteps = self._spaced(n) if timesteps is None else timesteps
            sigmas = np.interp(timesteps, np.arange(len(train)), train)
        alphas_cumprod = self._host["alphas_cumprod"]
        final = 0.0 if c["final_sigmas_type"] == "zero" else np.sqrt((1 - alphas_cumprod[0]) / alphas_cumprod[0])
        sigmas = np.concatenate([sigmas, [final]]).astype(np.float32)
        # α_t, σ_t of x_t = α_t x₀ + σ_t ε for each σ, and λ = log(α_t / σ_t) (inf at σ = 0)
        alpha_t = np.float32(1) / np.sqrt(sigmas * sigmas + np.float32(1))
        sigma_t = sigmas * alpha_t
        with np.errstate(divide="ignore"):
            lambda_t = np.log(alpha_t) - np.log(sigma_t)
        return np.trunc(timesteps), {"sigmas": sigmas, "alpha_t": alpha_t, "sigma_t": sigma_t, "lambda_t": lambda_t}

    # ----- step ------------------------------------------------------------------------------
    def _add_noise_at(self, run: SchedulerRun, original_samples: tc.Tensor, noise: tc.Tensor) -> tc.Tensor:
        check_pair("add_noise", original_samples, noise, "noise")
        device, dtype, i = original_samples.device, original_samples.dtype, run.position
        alpha, sigma = run.tables.get("alpha_t", device, dtype)[i], run.tables.get("sigma_t", device, dtype)[i]
        return alpha * original_samples + sigma * noise

    def _step_table(self, schedule: np.ndarray, tables: dict[str, np.ndarray]) -> np.ndarray:
        """Per step i: α_t and σ_t at σ[i] and σ[i + 1], and λ at i - 2 .. i + 1 (those before
        the first step are never read: 0)."""
        alpha, sigma, lam = tables["alpha_t"], tables["sigma_t"], tables["lambda_t"]
        rows = []
        for i in range(len(schedule)):
            earlier = [lam[k] if k >= 0 else np.float32(0) for k in (i - 2, i - 1)]
            rows.append((alpha[i], sigma[i], alpha[i + 1], sigma[i + 1], *earlier, lam[i], lam[i + 1]))
        return np.array(rows, dtype=np.float32).reshape(-1, 8)

    def _step(self, run: SchedulerRun, model_output: tc.Tensor, timestep: Any, sample: tc.Tensor,
              generator: tc.Generator | None = None, variance_noise: tc.Tensor | None = None,
              return_dict: bool = True) -> SchedulerOutput | tuple:
        op = "DPMSolverMultistepScheduler.step"
        check_pair(op, sample, self._prediction(model_output, sample), "model_output")
        return self._run_step(run, run._position(timestep, op), model_output, sample, return_dict,
                              generator=generator, variance_noise=variance_noise)

    def _prediction(self, model_output: tc.Tensor, sample: tc.Tensor) -> tc.Tensor:
        """The model output without a learned variance (its channels after the sample's)."""
        c = self._config
        if (c["variance_type"] in ("learned", "learned_range") and c["prediction_type"] == "epsilon"
                and isinstance(model_output, tc.Tensor) and isinstance(sample, tc.Tensor) and sample.ndim > 1):
            return model_output[:, :sample.shape[1]]  # drop the predicted variance
        return model_output

    def _prepare(self, run: SchedulerRun, position: int, sample: tc.Tensor, generator: tc.Generator | None = None,
                 variance_noise: tc.Tensor | None = None) -> StepArgs:
        c, i = self._config, position
        n, order = run.num_inference_steps, c["solver_order"]
        short = c["lower_order_final"] and n < 15  # few steps: lower orders at the end are steadier
        first_at_end = i == n - 1 and (c["euler_at_final"] or short or c["final_sigmas_type"] == "zero")
        second_at_end = i == n - 2 and short
        done = min(run.steps_taken, order)
        if order == 1 or done < 1 or first_at_end:
            order = 1
        elif order == 2 or done < 2 or second_at_end:
            order = 2
        noise = None
        if c["algorithm_type"] == "sde-dpmsolver++":
            noise = noise_source("DPMSolverMultistepScheduler.step", sample, generator, variance_noise)
        history = tuple(run.history[len(run.history) - order + 1:]) if order > 1 else ()
        return StepArgs((order,), run.step_values(i, sample.device), history, noise, tc.float32)

    def _history_after(self, run: SchedulerRun, original: tc.Tensor) -> list[tc.Tensor]:
        return (run.history + [original])[-self._config["solver_order"]:]

    def step_update(self, args: StepArgs, model_output: tc.Tensor, sample: tc.Tensor) -> tuple[tc.Tensor, tc.Tensor]:
        c = self._config
        model_output = self._prediction(model_output, sample)
        values = args.values
        original = predict_original(c["prediction_type"], model_output, sample, like(values[0], sample),
                                    like(values[1], sample))
        if c["thresholding"]:
            original = dynamic_threshold(original, c["dynamic_thresholding_ratio"], c["sample_max_value"])
        noise = None if args.noise is None else draw_noise(args.noise, model_output, args.noise_dtype)
        prev_sample = self._update(args.variant[0], values, (*args.history, original), upcast(sample), noise)
        return prev_sample.to(model_output.dtype), original

    def _update(self, order: int, values: tc.Tensor, history: tuple[tc.Tensor, ...], sample: tc.Tensor,
                noise: tc.Tensor | None) -> tc.Tensor:
        """x at σ[i + 1] from x at σ[i] with the last ``order`` x̂₀ (DPM-Solver++ eqs. 5, 8 and its 3M);
        ``values`` is the step's row of the step table."""
        sigma_s, alpha_t, sigma_t = values[1], values[2], values[3]
        lam_2, lam_1, lam_s, lam_t = values[4], values[5], values[6], values[7]
        h = lam_t - lam_s
        # D0 = m0 and the divided differences D1, D2 of the x̂₀ history in λ
        m = history[::-1]
        derivatives = [m[0]]
        if order == 2:
            r0 = (lam_s - lam_1) / h
            derivatives.append((1.0 / r0) * (m[0] - m[1]))
        elif order == 3:
            r0, r1 = (lam_s - lam_1) / h, (lam_1 - lam_2) / h
            d1_0, d1_1 = (1.0 / r0) * (m[0] - m[1]), (1.0 / r1) * (m[1] - m[2])
            derivatives += [d1_0 + (r0 / (r0 + r1)) * (d1_0 - d1_1), (1.0 / (r0 + r1)) * (d1_0 - d1_1)]
        midpoint = order == 2 and self._config["solver_type"] == "midpoint"
        if noise is None:  # dpmsolver++: the ODE
            expm1 = (-h).exp() - 1.0
            out = (sigma_t / sigma_s) * sample - (alpha_t * expm1) * derivatives[0]
            if order > 1:
                d1 = 0.5 * (alpha_t * expm1) if midpoint else -(alpha_t * (expm1 / h + 1.0))
                out = out - d1 * derivatives[1]
            if order > 2:
                out = out - (alpha_t * ((expm1 + h) / (h * h) - 0.5)) * derivatives[2]
            return out
        # sde-dpmsolver++: the SDE, with fresh noise
        decay = 1 - (-2.0 * h).exp()
        out = (sigma_t / sigma_s * (-h).exp()) * sample + (alpha_t * decay) * derivatives[0]
        if order > 1:
            d1 = 0.5 * (alpha_t * decay) if midpoint else alpha_t * (decay / (-2.0 * h) + 1.0)
            out = out + d1 * derivatives[1]
        if order > 2:
            out = out + (alpha_t * ((decay - 2.0 * h) / ((2.0 * h) * (2.0 * h)) - 0.5)) * derivatives[2]
        return out + (sigma_t * decay.sqrt()) * noise
