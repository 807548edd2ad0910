"""UniPC (Zhao et al. 2023, "UniPC: A Unified Predictor-Corrector Framework for Fast Sampling of
Diffusion Models"), as diffusers' ``UniPCMultistepScheduler``.

A step first corrects its input with the new model output (UniC), then predicts the next
sample (UniP).  The predictor that made the input and the corrector share their leading
terms, so the corrected sample is the input plus a combination of model outputs, and the
whole step is s x + Σ w_j m_j over the converted model outputs m (x̂₀, or ε with
``predict_x0=False``): the coefficients, from λ and the Vandermonde solves of the paper,
are computed on the host when the run starts.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

import tensorcore as tc

from .base import SchedulerBase, check_pair
from .config import register_to_config
from .dpm_solver import DPMSolverMultistepScheduler
from .output import SchedulerOutput
from .prediction import PREDICTION_TYPES, dynamic_threshold, like, predict_epsilon, predict_original, upcast
from .run import SchedulerRun, StepArgs
from .spacing import SPACINGS

# DPM-Solver's names for its solver types, which diffusers reads as bh2
_SOLVER_TYPE_ALIASES = {"midpoint": "bh2", "heun": "bh2", "logrho": "bh2"}


class UniPCMultistepScheduler(DPMSolverMultistepScheduler):
    """UniPC multistep sampling: DPM-Solver's σ schedules with a predictor-corrector update.

    Config keys, defaults and results are diffusers' (``solver_p``, beta and flow σ and
    dynamic shifting are not offered).  ``disable_corrector`` lists the step indices whose
    following step skips the corrector.  Runs keep the last ``solver_order`` converted model
    outputs; ``step_update``'s second result is the converted output (x̂₀, or ε with
    ``predict_x0=False``), and step results carry only ``prev_sample``, as diffusers'.

    ``step(model_output, timestep, sample, return_dict=True)``.
    """

    _unrounded_schedules = ()
    _choices = {"beta_schedule": ("linear", "scaled_linear", "squaredcos_cap_v2"),
                "prediction_type": PREDICTION_TYPES, "timestep_spacing": SPACINGS, "solver_order": (1, 2, 3),
                "solver_type": ("bh1", "bh2", *_SOLVER_TYPE_ALIASES), "final_sigmas_type": ("zero", "sigma_min"),
                "solver_p": (None,), "use_beta_sigmas": (False,), "use_flow_sigmas": (False,),
                "use_dynamic_shifting": (False,), "time_shift_type": ("exponential",), "shift_terminal": (None,)}

    @register_to_config
    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.0001, beta_end: float = 0.02,
                 beta_schedule: str = "linear", trained_betas: list[float] | None = None, solver_order: int = 2,
                 prediction_type: str = "epsilon", thresholding: bool = False,
                 dynamic_thresholding_ratio: float = 0.995, sample_max_value: float = 1.0, predict_x0: bool = True,
                 solver_type: str = "bh2", lower_order_final: bool = True, disable_corrector: Sequence[int] = (),
                 solver_p: None = None, use_karras_sigmas: bool = False, use_exponential_sigmas: bool = False,
                 use_beta_sigmas: bool = False, use_flow_sigmas: bool = False, flow_shift: float = 1.0,
                 timestep_spacing: str = "linspace", steps_offset: int = 0, final_sigmas_type: str = "zero",
                 rescale_betas_zero_snr: bool = False, use_dynamic_shifting: bool = False,
                 time_shift_type: str = "exponential", sigma_min: float | None = None,
                 sigma_max: float | None = None, shift_terminal: float | None = None) -> None:
        SchedulerBase.__init__(self)  # (DPM-Solver's __init__ would record its config keys)
        self._config["solver_type"] = _SOLVER_TYPE_ALIASES.get(solver_type, solver_type)
        self._make_sigmas()

    @property
    def _dpm_config(self) -> dict[str, Any]:
        return {**DPMSolverMultistepScheduler.config_defaults(), **self._config}

    # ----- the coefficients of a step --------------------------------------------------------
    @property
    def _levels(self) -> int:
        """Rows per position in the step table: one per number of steps taken, 0 .. solver_order + 1."""
        return self._config["solver_order"] + 2

    def _order(self, n: int, position: int, taken: int) -> int:
        """The predictor's order at ``position`` after ``taken`` steps of the run (diffusers' this_order)."""
        order = self._config["solver_order"]
        if self._config["lower_order_final"]:
            order = min(order, n - position)
        return min(order, min(taken, order) + 1)

    def _step_table(self, schedule: np.ndarray, tables: dict[str, np.ndarray]) -> np.ndarray:
        """Per position and steps taken (0 .. solver_order + 1, the last meaning more): α and σ
        at the step's σ (to convert the model output), s, and the weights of the current and
        the last solver_order converted outputs."""
        n, lam = len(schedule), tables["lambda_t"].astype(np.float64)
        alpha, sigma = tables["alpha_t"].astype(np.float64), tables["sigma_t"].astype(np.float64)
        width = 3 + self._config["solver_order"] + 1
        rows = np.zeros((n, self._levels, width), dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):  # λ = inf at a final σ of 0
            for i in range(n):
                for taken in range(min(i, self._levels - 1) + 1):  # a run starting part-way has taken fewer
                    rows[i, taken] = self._row(n, i, taken, lam, alpha, sigma, width)
        return rows.reshape(n * self._levels, width)

    def _row(self, n: int, i: int, taken: int, lam: np.ndarray, alpha: np.ndarray, sigma: np.ndarray,
             width: int) -> np.ndarray:
        row = np.zeros(width)
        row[0], row[1] = alpha[i], sigma[i]
        weights = row[3:]  # on m_i, m_{i-1}, ...
        correct = taken > 0 and i - 1 not in self._config["disable_corrector"]
        if correct:  # UniC at i over the step i - 1 -> i, less the UniP part already in x
            q = self._order(n, i - 1, taken - 1)
            scale, B_h, rks, _, rhos_c = self._solve(lam, alpha, sigma, i - 1, q, corrector=True)
            rhos_p = self._solve(lam, alpha, sigma, i - 1, q, corrector=False)[4]
            for k in range(1, q):
                extra = (rhos_c[k - 1] - (rhos_p[k - 1] if rhos_p.size else 0.0)) / rks[k - 1]
                weights[k + 1] -= scale * B_h * extra
                weights[1] += scale * B_h * extra
            weights[0] -= scale * B_h * rhos_c[-1]
            weights[1] += scale * B_h * rhos_c[-1]
        p = self._order(n, i, taken)  # UniP from i to i + 1, on the corrected sample
        scale, B_h, rks, h_phi_1, rhos_p = self._solve(lam, alpha, sigma, i, p, corrector=False)
        if self._config["predict_x0"]:
            s = sigma[i + 1] / sigma[i]
        else:
            s = alpha[i + 1] / alpha[i]
        weights *= s
        weights[0] -= scale * h_phi_1
        for k in range(1, p):
            weights[k] -= scale * B_h * rhos_p[k - 1] / rks[k - 1]
            weights[0] += scale * B_h * rhos_p[k - 1] / rks[k - 1]
        row[2] = s
        return row

    def _solve(self, lam: np.ndarray, alpha: np.ndarray, sigma: np.ndarray, i: int, order: int,
               corrector: bool) -> tuple[float, float, np.ndarray, float, np.ndarray]:
        """UniPC's B(h) update from σ[i] to σ[i + 1] with ``order`` outputs: (α_t or σ_t, B(h),
        the ratios r_k, h φ₁(h), and ρ: the predictor's (order - 1 of them) or the corrector's
        (order of them))."""
        h = lam[i + 1] - lam[i]
        rks = np.array([(lam[i - k] - lam[i]) / h for k in range(1, order)] + [1.0])
        predict_x0 = self._config["predict_x0"]
        hh = -h if predict_x0 else h
        h_phi_1 = math.expm1(hh)
        B_h = hh if self._config["solver_type"] == "bh1" else math.expm1(hh)
        R, b = [], []
        h_phi_k, factorial = h_phi_1 / hh - 1, 1
        for j in range(1, order + 1):
            R.append(rks ** (j - 1))
            b.append(h_phi_k * factorial / B_h)
            factorial *= j + 1
            h_phi_k = h_phi_k / hh - 1 / factorial
        R, b = np.array(R), np.array(b)
        try:
            if corrector:
                rhos = np.array([0.5]) if order == 1 else np.linalg.solve(R, b)
            elif order == 1:
                rhos = np.zeros(0)
            else:
                rhos = np.array([0.5]) if order == 2 else np.linalg.solve(R[:-1, :-1], b[:-1])
        except np.linalg.LinAlgError:  # the last step to σ = 0 at order 3 (as in diffusers)
            target = sigma[i + 1] / alpha[i + 1]
            raise ValueError(f"UniPCMultistepScheduler: a solver_order {order} step to σ = {target:g} is singular; "
                             f"use lower_order_final=True or final_sigmas_type='sigma_min'") from None
        scale = alpha[i + 1] if predict_x0 else sigma[i + 1]
        return scale, B_h, rks, h_phi_1, rhos

    # ----- step ------------------------------------------------------------------------------
    def _step(self, run: SchedulerRun, model_output: tc.Tensor, timestep: Any, sample: tc.Tensor,
              return_dict: bool = True) -> SchedulerOutput | tuple:
        op = "UniPCMultistepScheduler.step"
        check_pair(op, sample, model_output, "model_output")
        prev_sample, converted = self.step_update(self._prepare(run, run._position(timestep, op), sample),
                                                  model_output, sample)
        run.finish_step(converted)
        out = SchedulerOutput(prev_sample)
        return out if return_dict else out.to_tuple()

    def _prepare(self, run: SchedulerRun, position: int, sample: tc.Tensor) -> StepArgs:
        taken = min(run.steps_taken, self._levels - 1)
        count = min(len(run.history), self._config["solver_order"])
        history = tuple(run.history[len(run.history) - count:]) if count else ()
        return StepArgs((count,), run.step_values(position * self._levels + taken, sample.device), history)

    def step_update(self, args: StepArgs, model_output: tc.Tensor, sample: tc.Tensor) -> tuple[tc.Tensor, tc.Tensor]:
        """(x at the next σ, the converted model output the run keeps)."""
        c, values = self._config, args.values
        alpha, sigma = like(values[0], sample), like(values[1], sample)
        if c["predict_x0"]:
            converted = predict_original(c["prediction_type"], model_output, sample, alpha, sigma)
            if c["thresholding"]:
                converted = dynamic_threshold(converted, c["dynamic_thresholding_ratio"], c["sample_max_value"])
        else:
            converted = predict_epsilon(c["prediction_type"], model_output, sample, alpha, sigma,
                                        predict_original(c["prediction_type"], model_output, sample, alpha, sigma))
        x = upcast(sample)
        prev_sample = like(values[2], x) * x + like(values[3], x) * converted
        for k, kept in enumerate(reversed(args.history), start=1):
            prev_sample = prev_sample + like(values[3 + k], x) * kept
        return prev_sample.to(sample.dtype), converted
