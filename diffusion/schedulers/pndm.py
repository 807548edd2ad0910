"""Pseudo numerical methods (Liu et al. 2022, "Pseudo Numerical Methods for Diffusion Models
on Manifolds"), as diffusers' ``PNDMScheduler``: PLMS, after a Runge-Kutta warm-up (PRK)
unless ``skip_prk_steps``.

Every step is PNDM's transfer x_prev = A x_base - B ε̂ (the paper's eq. 9) with ε̂ a fixed
combination of model outputs.  Where the base is an earlier step's sample (the Runge-Kutta
stages, and PLMS's second step), it is recovered from this step's input and the previous
model output, so each step is one linear combination of the sample and the model outputs:
x_prev = s x + Σ w_j ε_j, with s and w in the run's step table.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import tensorcore as tc

from .base import FinalAlphaCumprod, SchedulerBase, check_pair
from .config import register_to_config
from .output import SchedulerOutput
from .prediction import like
from .run import SchedulerRun, StepArgs
from .spacing import SPACINGS, spaced_timesteps

PLMS_WEIGHTS = {1: (1.0,), 2: (3 / 2, -1 / 2), 3: (23 / 12, -16 / 12, 5 / 12),
                4: (55 / 24, -59 / 24, 37 / 24, -9 / 24)}  # Adams-Bashforth, newest output first
RK_WEIGHTS = (1 / 6, 1 / 3, 1 / 3, 1 / 6)
PRK_STEPS = 12  # three Runge-Kutta steps of four model calls


class PNDMScheduler(FinalAlphaCumprod, SchedulerBase):
    """PLMS (4th-order linear multistep on PNDM's transfer), Stable Diffusion 1.x's default.

    Config keys, defaults and results are diffusers'.  With ``skip_prk_steps=False`` the
    first three steps are Runge-Kutta steps of four model calls each (12 timesteps, needing
    ``num_inference_steps`` >= 4); with ``skip_prk_steps=True`` the second timestep repeats
    and its step averages two model outputs, as in diffusers.  Runs keep the model outputs
    later steps read, so ``step_update``'s second result is the model output (PNDM predicts
    no x̂₀ and its step results carry only ``prev_sample``).

    ``step(model_output, timestep, sample, return_dict=True)``.
    """

    solver_history = True
    _choices = {"beta_schedule": ("linear", "scaled_linear", "squaredcos_cap_v2"),
                "prediction_type": ("epsilon", "v_prediction"), "timestep_spacing": SPACINGS}

    @register_to_config
    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.0001, beta_end: float = 0.02,
                 beta_schedule: str = "linear", trained_betas: list[float] | None = None,
                 skip_prk_steps: bool = False, set_alpha_to_one: bool = False, prediction_type: str = "epsilon",
                 timestep_spacing: str = "leading", steps_offset: int = 0) -> None:
        super().__init__()
        self._set_final_alpha_cumprod(set_alpha_to_one)

    # ----- schedule --------------------------------------------------------------------------
    def _schedule(self, num_inference_steps: int, timesteps: np.ndarray | None) -> tuple[np.ndarray, dict]:
        c, n = self._config, num_inference_steps
        if timesteps is not None:
            raise ValueError("PNDMScheduler.start: custom timesteps are not supported (its steps follow "
                             "num_inference_steps); pass num_inference_steps")
        if not c["skip_prk_steps"] and n < 4:
            raise ValueError(f"PNDMScheduler.start: skip_prk_steps=False needs num_inference_steps >= 4 "
                             f"(four Runge-Kutta timesteps), got {n}")
        T = c["num_train_timesteps"]
        ascending = spaced_timesteps(c["timestep_spacing"], T, n, c["steps_offset"])[::-1]
        if c["skip_prk_steps"]:  # the second timestep twice
            schedule = np.concatenate([ascending[:-1], ascending[-2:-1], ascending[-1:]])[::-1]
        else:  # each of the last four timesteps, its half step and the next, then PLMS below them
            halves = ascending[-4:].repeat(2) + np.tile([0, T // n // 2], 4)
            prk = halves[:-1].repeat(2)[1:-1][::-1]
            schedule = np.concatenate([prk, ascending[:-3][::-1]])
        schedule = schedule.astype(np.int64)
        coefficients, used = self._plan(schedule, n)
        return schedule, {"coefficients": coefficients, "history_used": used}

    def _step_table(self, schedule: np.ndarray, tables: dict[str, np.ndarray]) -> np.ndarray:
        """Per step and level: s, the current model output's weight, then the last three kept outputs'."""
        return tables["coefficients"]

    def _transfer(self, t: int, prev: int) -> tuple[float, float]:
        """(A, B) of x_prev = A x_t - B m for a raw model output m (v-prediction folded in)."""
        alpha_bar = self._host["alphas_cumprod"].astype(np.float64)
        a_t = alpha_bar[t]
        a_prev = alpha_bar[prev] if prev >= 0 else float(self._host["final_alpha_cumprod"])
        sample_coeff = np.sqrt(a_prev / a_t)
        eps_coeff = (a_prev - a_t) / (a_t * np.sqrt(1 - a_prev) + np.sqrt(a_t * (1 - a_t) * a_prev))
        if self._config["prediction_type"] == "v_prediction":  # ε̂ = sqrt(ᾱ_t) v + sqrt(1 - ᾱ_t) x_t
            return sample_coeff - eps_coeff * np.sqrt(1 - a_t), eps_coeff * np.sqrt(a_t)
        return sample_coeff, eps_coeff

    @property
    def _levels(self) -> int:
        """Rows per position: PLMS steps by how many steps the run has taken (0 .. 3, then 4 for
        more), as diffusers' counter, so a run started part-way warms up again; Runge-Kutta
        runs always start at the first timestep (one row)."""
        return 5 if self._config["skip_prk_steps"] else 1

    def _stage(self, schedule: np.ndarray, n: int, p: int, counter: int) -> tuple[float, float, list[float], bool]:
        """Step ``p``, the run's ``counter``-th: (A, B) of its transfer, ε̂'s weights on the current
        output then on the newest kept ones, and whether its base is the previous step's."""
        T, t = self._config["num_train_timesteps"], int(schedule[p])
        if counter < self._prk_steps:  # Runge-Kutta stage r, from the group's first sample and timestep
            r = counter % 4
            A, B = self._transfer(int(schedule[p - r]), t - (0 if counter % 2 else T // n // 2))
            return A, B, [1.0] if r == 0 else [1.0, 0.0] if r < 3 else [RK_WEIGHTS[3], *RK_WEIGHTS[2::-1]], r > 0
        if counter == 1:  # skip_prk_steps: x from the first sample and (ε0 + ε1) / 2
            A, B = self._transfer(t + T // n, t)
            return A, B, [0.5, 0.5], True
        order = 4 if self._prk_steps else min(counter, 4) if counter > 1 else 1  # after PRK, three are kept
        A, B = self._transfer(t, t - T // n)
        return A, B, list(PLMS_WEIGHTS[order]), False

    def _plan(self, schedule: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Per position and level (steps taken): [s, w_current, w_kept[-1], w_kept[-2], w_kept[-3]]
        of x_prev = s x + Σ w ε, and how many kept model outputs it reads (the newest)."""
        levels = self._levels
        rows, used = np.zeros((len(schedule), levels, 5)), np.zeros((len(schedule), levels), dtype=np.int64)
        for p in range(len(schedule)):
            for level in range(min(p, levels - 1) + 1):  # a run started part-way has taken fewer
                counter = p if levels == 1 else level
                A, B, combo, base_is_previous = self._stage(schedule, n, p, counter)
                weights = [-B * w for w in combo] + [0.0] * (4 - len(combo))
                s = A
                if base_is_previous:  # x_base = (x_in + B' ε_prev) / A', ε_prev the newest kept output
                    A_prev, B_prev = self._stage(schedule, n, p - 1, counter - 1)[:2]
                    s = A / A_prev
                    weights[1] += A * B_prev / A_prev
                rows[p, level] = [s, *weights]
                used[p, level] = len(combo) - 1
        return rows.reshape(-1, 5).astype(np.float32), used.reshape(-1)

    @property
    def _prk_steps(self) -> int:
        return 0 if self._config["skip_prk_steps"] else PRK_STEPS

    # ----- step ------------------------------------------------------------------------------
    def _step(self, run: SchedulerRun, model_output: tc.Tensor, timestep: Any, sample: tc.Tensor,
              return_dict: bool = True) -> SchedulerOutput | tuple:
        op = "PNDMScheduler.step"
        check_pair(op, sample, model_output, "model_output")
        position = run._position(timestep, op)
        prev_sample, kept = self.step_update(self._prepare(run, position, sample), model_output, sample)
        run.finish_step(kept)
        out = SchedulerOutput(prev_sample)
        return out if return_dict else out.to_tuple()

    def _prepare(self, run: SchedulerRun, position: int, sample: tc.Tensor) -> StepArgs:
        if run.steps_taken != position and not self._config["skip_prk_steps"]:
            raise ValueError("PNDMScheduler.step: a run with the Runge-Kutta warm-up (skip_prk_steps=False) "
                             "starts at its first timestep; use skip_prk_steps=True to start part-way")
        row = position * self._levels + min(run.steps_taken, self._levels - 1)
        count = int(run.tables.host["history_used"][row])
        history = tuple(run.history[len(run.history) - count:]) if count else ()
        return StepArgs((count,), run.step_values(row, sample.device), history)

    def _history_after(self, run: SchedulerRun, output: tc.Tensor) -> list[tc.Tensor]:
        """The model outputs later steps read: during Runge-Kutta, each group's first output
        and its stages 1 and 2 until the group ends; then the last three PLMS outputs (the
        repeated timestep's output of ``skip_prk_steps`` is not kept, as in diffusers)."""
        counter, kept = run.steps_taken, run.history + [output]
        if counter < self._prk_steps:
            return kept[:-3] if counter % 4 == 3 else kept
        if counter == 1:  # (skip_prk_steps)
            return kept[:-1]
        return kept[-3:]

    def step_update(self, args: StepArgs, model_output: tc.Tensor, sample: tc.Tensor) -> tuple[tc.Tensor, tc.Tensor]:
        """(x_prev, the model output, which the run keeps)."""
        values = args.values
        prev_sample = like(values[0], sample) * sample + like(values[1], sample) * model_output
        for j, kept in enumerate(reversed(args.history)):
            prev_sample = prev_sample + like(values[2 + j], sample) * kept
        return prev_sample, model_output
