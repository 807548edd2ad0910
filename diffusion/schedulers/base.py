"""What every scheduler shares: the ᾱ tables, runs, the forward process and diffusers' surface.

A scheduler holds its config and precomputed tables, nothing per generation.
``start(n)`` makes a ``SchedulerRun`` that owns one generation's timesteps and state;
diffusers' ``set_timesteps`` + ``step`` drive one default run kept on the scheduler.
"""

from __future__ import annotations

import abc
import numbers
from typing import Any, ClassVar, Sequence

import numpy as np

import tensorcore as tc
from tensorcore import dtypes
from tensorcore.tracing import is_tracing
from tensorcore.random import default_generator

from .betas import beta_schedule, cumprod, rescale_zero_terminal_snr
from .config import ConfigMixin
from .output import SchedulerOutput
from .run import SchedulerRun, StepArgs
from .spacing import spaced_timesteps
from .tables import DeviceTables


class SchedulerBase(ConfigMixin, abc.ABC):
    """Config, ᾱ tables and the parts of diffusers' scheduler API that every scheduler shares."""

    order: ClassVar[int] = 1
    output_type: ClassVar[type] = SchedulerOutput  # what ``step`` returns: (prev_sample, x̂₀)
    schedule_options: ClassVar[tuple[str, ...]] = ()  # ``start``'s keywords beyond diffusers' common ones
    solver_history: ClassVar[bool] = False  # steps read earlier steps' x̂₀ (``run.finish_step`` keeps them)
    timestep_dtype: ClassVar[Any] = np.int64

    def __init__(self) -> None:
        config = self._config
        self._check_config(config)
        betas = beta_schedule(config["beta_schedule"], config["num_train_timesteps"], config["beta_start"],
                              config["beta_end"], config["trained_betas"])
        if config["trained_betas"] is not None and len(betas) != config["num_train_timesteps"]:
            raise ValueError(f"{type(self).__name__}: trained_betas has {len(betas)} values but "
                             f"num_train_timesteps is {config['num_train_timesteps']}")
        if not np.all((betas >= 0) & (betas < 1)):
            raise ValueError(f"{type(self).__name__}: beta_start={config['beta_start']} and "
                             f"beta_end={config['beta_end']} give betas outside [0, 1)")
        if config.get("rescale_betas_zero_snr", False):  # PNDM has no such key
            betas = rescale_zero_terminal_snr(betas)
        alphas = np.float32(1) - betas
        self._host = {"betas": betas, "alphas": alphas, "alphas_cumprod": cumprod(alphas)}
        self.tables = DeviceTables(self._host)
        self._default_run: SchedulerRun | None = None

    def _check_config(self, config: dict[str, Any]) -> None:
        """Checks that involve several keys (per scheduler)."""

    # ----- runs ------------------------------------------------------------------------
    def start(self, num_inference_steps: int | None = None, device: str | None = None,
              timesteps: Sequence[int] | None = None, **options: Any) -> SchedulerRun:
        """A new run over ``num_inference_steps`` steps (or the given descending ``timesteps``).

        ``device`` is where ``run.timesteps`` lives (default CPU); the sample math runs
        on the sample's device whatever it is.  ``options`` are the scheduler's own
        schedule options (LCM's ``original_inference_steps`` and ``strength``).
        """
        name = f"{type(self).__name__}.start"
        unknown = sorted(set(options) - set(self.schedule_options))
        if unknown:
            raise TypeError(f"{name}: unexpected arguments {unknown} (this scheduler takes "
                            f"{list(self.schedule_options) or 'none beyond num_inference_steps, device, timesteps'})")
        if (num_inference_steps is None) == (timesteps is None):
            raise ValueError(f"{name}: pass exactly one of num_inference_steps and timesteps")
        if timesteps is not None:
            custom = self._checked_timesteps(timesteps, name)
            schedule, tables = self._schedule(len(custom), custom, **options)
        else:
            schedule, tables = self._schedule(self._checked_steps(num_inference_steps, name), None, **options)
        schedule = schedule.astype(self.timestep_dtype)
        tables["steps"] = np.ascontiguousarray(self._step_table(schedule, tables), dtype=np.float32)
        return SchedulerRun(self, schedule, device or "cpu", tables)

    def _checked_steps(self, num_inference_steps: Any, name: str) -> int:
        T = self._config["num_train_timesteps"]
        if not isinstance(num_inference_steps, numbers.Integral) or isinstance(num_inference_steps, bool) \
                or num_inference_steps < 1:
            raise ValueError(f"{name}: num_inference_steps must be a positive int, got {num_inference_steps!r}")
        if num_inference_steps > T:
            raise ValueError(f"{name}: num_inference_steps ({num_inference_steps}) cannot be larger than "
                             f"num_train_timesteps ({T})")
        return int(num_inference_steps)

    def _checked_timesteps(self, timesteps: Sequence[float], name: str) -> np.ndarray:
        """Custom timesteps as float64, checked: descending, within [0, T), whole where the dtype is."""
        T = self._config["num_train_timesteps"]
        custom = np.asarray(timesteps)
        if custom.ndim != 1 or custom.size == 0 or custom.dtype.kind not in "iuf":
            raise ValueError(f"{name}: timesteps must be a non-empty list of numbers, got {timesteps!r}")
        if np.dtype(self.timestep_dtype).kind == "i" and np.any(custom != np.round(custom)):
            raise ValueError(f"{name}: timesteps must be whole numbers, got {custom.tolist()}")
        if np.any(np.diff(custom) >= 0) or custom[0] > T - 1 or custom[-1] < 0:
            raise ValueError(f"{name}: timesteps must descend within [0, {T - 1}], got {custom.tolist()}")
        return custom.astype(np.float64)

    def _schedule(self, num_inference_steps: int, timesteps: np.ndarray | None
                  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """A run's timesteps (host, descending) and its own host tables (DDPM's and DDIM's:
        the spaced training timesteps, no tables)."""
        if timesteps is None:
            c = self._config
            timesteps = spaced_timesteps(c["timestep_spacing"], c["num_train_timesteps"], num_inference_steps,
                                         c["steps_offset"])
        return timesteps, {}

    @abc.abstractmethod
    def _step_table(self, schedule: np.ndarray, tables: dict[str, np.ndarray]) -> np.ndarray:
        """A run's per-step numbers, one row per timestep (``StepArgs.values``), from its
        timesteps and its own tables: the step's arithmetic reads them on the device."""

    @abc.abstractmethod
    def _step(self, run: SchedulerRun, model_output: tc.Tensor, timestep: Any, sample: tc.Tensor,
              *args: Any, **kwargs: Any) -> SchedulerOutput | tuple:
        """One step of ``run``: what ``step`` does, with the scheduler's own arguments."""

    @abc.abstractmethod
    def _prepare(self, run: SchedulerRun, position: int, sample: tc.Tensor, **kwargs: Any) -> StepArgs:
        """The host part of step ``position``: its checks and decisions, and its device numbers."""

    @abc.abstractmethod
    def step_update(self, args: StepArgs, model_output: tc.Tensor,
                    sample: tc.Tensor) -> tuple[tc.Tensor, tc.Tensor]:
        """The device part of a step: (previous sample, x̂₀), tensor ops only, so a traced step
        replays for every step of a run (``run.prepare_step`` gives ``args``)."""

    def step_input(self, args: StepArgs, sample: tc.Tensor) -> tc.Tensor:
        """The model input of the step ``args`` describes (only Euler scales it); device only."""
        return sample

    def _history_after(self, run: SchedulerRun, original: tc.Tensor) -> list[tc.Tensor] | None:
        """The solver history to keep after a step with x̂₀ ``original`` (None: none kept)."""
        return None

    def _run_step(self, run: SchedulerRun, position: int, model_output: tc.Tensor, sample: tc.Tensor,
                  return_dict: bool, **kwargs: Any) -> SchedulerOutput | tuple:
        """``step``'s common part after the checks: prepare, update, move on."""
        prev_sample, original = self.step_update(self._prepare(run, position, sample, **kwargs), model_output, sample)
        run.finish_step(original)
        out = self.output_type(prev_sample, original)
        return out if return_dict else out.to_tuple()

    def _scale_model_input(self, run: SchedulerRun | None, sample: tc.Tensor, timestep: Any) -> tc.Tensor:
        return sample

    def _init_noise_sigma(self, run: SchedulerRun | None) -> float:
        return 1.0

    def _add_noise_at(self, run: SchedulerRun, original_samples: tc.Tensor, noise: tc.Tensor) -> tc.Tensor:
        return self.add_noise(original_samples, noise, run.timestep_at(run.position))

    # ----- diffusers' stateful surface: one default run ----------------------------------
    def set_timesteps(self, num_inference_steps: int | None = None, device: str | None = None,
                      timesteps: Sequence[int] | None = None, **options: Any) -> None:
        """Start the default run that ``step`` and ``scale_model_input`` drive (as in diffusers)."""
        self._default_run = self.start(num_inference_steps, device, timesteps, **options)

    def _run(self, op: str) -> SchedulerRun:
        if self._default_run is None:
            raise ValueError(f"{type(self).__name__}.{op}: no timesteps yet; call set_timesteps("
                             f"num_inference_steps) first, or use run = scheduler.start(n)")
        return self._default_run

    def step(self, model_output: tc.Tensor, timestep: Any, sample: tc.Tensor, *args: Any,
             **kwargs: Any) -> SchedulerOutput | tuple:
        """One step of the default run (see the scheduler's class docs for the arguments)."""
        return self._step(self._run("step"), model_output, timestep, sample, *args, **kwargs)

    def scale_model_input(self, sample: tc.Tensor, timestep: Any = None) -> tc.Tensor:
        """The model input for ``timestep`` (only Euler scales it)."""
        return self._scale_model_input(self._default_run, sample, timestep)

    def set_begin_index(self, begin_index: int = 0) -> None:
        self._run("set_begin_index").set_begin_index(begin_index)

    @property
    def timesteps(self) -> tc.Tensor:
        """The default run's timesteps; before ``set_timesteps``, every training timestep."""
        if self._default_run is not None:
            return self._default_run.timesteps
        return tc.tensor(self._training_timesteps())

    def _training_timesteps(self) -> np.ndarray:
        return np.arange(self._config["num_train_timesteps"])[::-1].astype(self.timestep_dtype)

    @property
    def num_inference_steps(self) -> int | None:
        return None if self._default_run is None else self._default_run.num_inference_steps

    @property
    def step_index(self) -> int | None:
        return None if self._default_run is None else self._default_run.position

    @property
    def begin_index(self) -> int | None:
        return None if self._default_run is None else self._default_run.begin_index

    @property
    def init_noise_sigma(self) -> float:
        """Standard deviation of the starting noise (the default run's, for Euler)."""
        return self._init_noise_sigma(self._default_run)

    # ----- tables ------------------------------------------------------------------------
    @property
    def betas(self) -> tc.Tensor:
        return tc.tensor(self._host["betas"])

    @property
    def alphas(self) -> tc.Tensor:
        return tc.tensor(self._host["alphas"])

    @property
    def alphas_cumprod(self) -> tc.Tensor:
        return tc.tensor(self._host["alphas_cumprod"])

    def __len__(self) -> int:
        return self._config["num_train_timesteps"]

    # ----- the forward process -------------------------------------------------------------
    def add_noise(self, original_samples: tc.Tensor, noise: tc.Tensor, timesteps: Any) -> tc.Tensor:
        """x_t = sqrt(ᾱ_t) x₀ + sqrt(1 - ᾱ_t) ε, one timestep per batch item (or one for all)."""
        alpha_bar = self._at_timesteps("alphas_cumprod", timesteps, original_samples, noise, "add_noise")
        return alpha_bar.sqrt() * original_samples + (1 - alpha_bar).sqrt() * noise

    def get_velocity(self, sample: tc.Tensor, noise: tc.Tensor, timesteps: Any) -> tc.Tensor:
        """The v-prediction target v = sqrt(ᾱ_t) ε - sqrt(1 - ᾱ_t) x₀."""
        alpha_bar = self._at_timesteps("alphas_cumprod", timesteps, sample, noise, "get_velocity")
        return alpha_bar.sqrt() * noise - (1 - alpha_bar).sqrt() * sample

    def _at_timesteps(self, name: str, timesteps: Any, x: tc.Tensor, noise: tc.Tensor, op: str) -> tc.Tensor:
        """Table ``name`` at ``timesteps`` on x's device in x's dtype, shaped to broadcast over x.

        Fractional timesteps interpolate linearly between neighbours; all on the device.
        """
        check_pair(op, x, noise, "noise")
        t = timestep_tensor(timesteps, x, op, len(self))
        table = self.tables.get(name, x.device, x.dtype)
        if dtypes.is_floating(t.dtype):
            low = t.to(tc.int64)
            high = tc.minimum(low + 1, len(self) - 1)
            values = table[low] + (t - low.to(t.dtype)).to(x.dtype) * (table[high] - table[low])
        else:
            values = table[t]
        return values.reshape((-1,) + (1,) * (x.ndim - 1))


class FinalAlphaCumprod:
    """For schedulers whose last step goes to ᾱ "before" timestep 0 (``set_alpha_to_one``)."""

    _host: dict[str, np.ndarray]

    def _set_final_alpha_cumprod(self, set_alpha_to_one: bool) -> None:
        """ᾱ before timestep 0: 1, or ᾱ₀."""
        final = np.float32(1.0) if set_alpha_to_one else self._host["alphas_cumprod"][0]
        self._host["final_alpha_cumprod"] = np.asarray(final, dtype=np.float32)

    @property
    def final_alpha_cumprod(self) -> tc.Tensor:
        return tc.tensor(self._host["final_alpha_cumprod"])


def timestep_tensor(timesteps: Any, x: tc.Tensor, op: str, num_train_timesteps: int | None = None) -> tc.Tensor:
    """``timesteps`` (a number, list, array or tensor) as a 1-D tensor on x's device, one per
    batch item or one for all; host values are checked to lie in [0, num_train_timesteps)."""
    if isinstance(timesteps, tc.Tensor):
        t = timesteps.reshape(-1)
    else:
        array = np.asarray(timesteps).reshape(-1)
        if array.dtype.kind not in "iuf":
            raise TypeError(f"{op}: timesteps must be numbers, got {timesteps!r}")
        t = tc.tensor(array)
    if t.dtype.kind not in "iuf":
        raise TypeError(f"{op}: timesteps must be integer or float, got {t.dtype}")
    if t.shape[0] not in (1, x.shape[0] if x.ndim else 1):
        raise ValueError(f"{op}: got {t.shape[0]} timesteps for a batch of {x.shape[0] if x.ndim else 1}")
    if t.device == "cpu" and num_train_timesteps is not None and not is_tracing():
        values = t.numpy()  # a traced call cannot read values: its timesteps are checked eagerly
        if np.any(values < 0) or np.any(values > num_train_timesteps - 1):
            raise ValueError(f"{op}: timesteps must lie in [0, {num_train_timesteps - 1}], got {values.tolist()}")
    return t if t.device == x.device else t.to(x.device)


def check_pair(op: str, x: tc.Tensor, other: tc.Tensor, name: str) -> None:
    """``x`` and ``other`` are tensors of one shape on one device."""
    for value, label in ((x, "sample"), (other, name)):
        if not isinstance(value, tc.Tensor):
            raise TypeError(f"{op}: {label} must be a tensorcore Tensor, got {type(value).__name__}")
    if other.shape != x.shape:
        raise ValueError(f"{op}: {name} has shape {other.shape}, the sample {x.shape}")
    if other.device != x.device:
        raise ValueError(f"{op}: {name} is on {other.device}, the sample on {x.device}")


def noise_source(op: str, like: tc.Tensor, generator: tc.Generator | None,
                 variance_noise: tc.Tensor | None) -> tc.Generator | tc.Tensor:
    """Where a stochastic step's noise comes from (checked): ``variance_noise`` if given, else
    ``generator`` (the device's default generator when None); ``draw_noise`` draws it."""
    if variance_noise is not None:
        if generator is not None:
            raise ValueError(f"{op}: pass either generator or variance_noise, not both")
        check_pair(op, like, variance_noise, "variance_noise")
        return variance_noise
    return generator if generator is not None else default_generator(like.device)
