"""One generation's pass over a schedule: its timesteps, where it is, its solver history.

A step is split in two so that its device part can be traced once and replayed for
every step of a run (``tc.compile``): ``run.prepare_step`` takes the host-side
decisions (which step, which solver order, whether noise is added, the argument
checks) and hands back a ``StepArgs`` whose per-step numbers are a device tensor;
``scheduler.step_update(args, model_output, sample)`` is the arithmetic, tensors
only; ``run.finish_step`` moves the run on.  ``run.step`` is the three in a row.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

import tensorcore as tc

from .tables import DeviceTables

if TYPE_CHECKING:
    from .base import SchedulerBase
    from .output import SchedulerOutput


@dataclasses.dataclass(frozen=True)
class StepArgs:
    """What one step's device part needs, decided on the host.

    ``variant``: the step's static choices (hashable: a solver order, whether noise is
    added, eta...), a handful per run.  ``values``: the step's numbers (ᾱ, σ, λ at this
    step and its neighbours), a row of the run's step table on the sample's device, so
    one traced step serves every step of a run.  ``history``: the solver's previous x̂₀
    this step reads (DPM-Solver).  ``noise``: where a stochastic step's noise comes
    from -- a ``tc.Generator`` drawn from inside the step, or the noise itself -- and
    ``noise_dtype`` the dtype it is drawn in (None: the model output's).
    """

    variant: tuple
    values: tc.Tensor
    history: tuple[tc.Tensor, ...] = ()
    noise: tc.Generator | tc.Tensor | None = None
    noise_dtype: Any = None

    def with_noise_drawn(self, like: tc.Tensor, dtype: Any) -> "StepArgs":
        """These arguments with a generator's noise drawn now, as a tensor on ``like``'s device
        shaped like it, in ``noise_dtype`` or else ``dtype`` (the model output's)."""
        if not isinstance(self.noise, tc.Generator):
            return self
        drawn = draw_noise(self.noise, like, self.noise_dtype if self.noise_dtype is not None else dtype)
        return dataclasses.replace(self, noise=drawn)


def draw_noise(source: tc.Generator | tc.Tensor, like: tc.Tensor, dtype: Any = None) -> tc.Tensor:
    """Standard-normal noise shaped like ``like``: drawn from a generator (on its device, then
    moved to ``like``'s, as diffusers' ``randn_tensor``), or ``source`` itself cast to ``dtype``."""
    dtype = like.dtype if dtype is None else dtype
    if isinstance(source, tc.Tensor):
        return source.to(dtype=dtype)
    noise = tc.randn(*like.shape, dtype=dtype, device=source.device, generator=source)
    return noise if noise.device == like.device else noise.to(like.device)


class SchedulerRun:
    """The per-generation state of sampling with a scheduler (``scheduler.start(n)``).

    A run owns its timesteps (on the host, and as ``timesteps`` on the requested
    device), its σ tables where the scheduler has them, its position and any solver
    history.  The scheduler holds only config and tables, so any number of runs can
    step at once on one scheduler object.  Steps are taken by position: step k uses
    the k-th timestep of the run (after ``set_begin_index``), never a search of the
    timestep list.  One run serves one generation; it is not meant to be shared
    between threads.
    """

    def __init__(self, scheduler: SchedulerBase, timesteps: np.ndarray, device: str,
                 tables: dict[str, np.ndarray] | None = None) -> None:
        """``tables``: the run's host tables; ``tables["steps"]`` holds one row of per-step
        numbers per timestep (``StepArgs.values``)."""
        self.scheduler = scheduler
        self.schedule = timesteps
        self.timesteps = tc.tensor(timesteps, device=device)
        self.num_inference_steps = len(timesteps)
        self.tables = DeviceTables(tables or {})
        self.begin_index: int | None = None
        self.position = 0
        self.steps_taken = 0
        self.history: list[tc.Tensor] = []
        self.input_scaled = False

    def __len__(self) -> int:
        return self.num_inference_steps

    def __repr__(self) -> str:
        return (f"SchedulerRun({type(self.scheduler).__name__}, step {self.position} of "
                f"{self.num_inference_steps}, timesteps={self.schedule.tolist()})")

    @property
    def step_index(self) -> int:
        """The position of the next step in ``timesteps``."""
        return self.position

    @property
    def finished(self) -> bool:
        return self.position >= self.num_inference_steps

    @property
    def init_noise_sigma(self) -> float:
        """The standard deviation of the starting noise for this run."""
        return self.scheduler._init_noise_sigma(self)

    @property
    def sigmas(self) -> tc.Tensor:
        """This run's σ schedule (one more entry than timesteps; schedulers that use σ)."""
        if "sigmas" not in self.tables.host:
            raise AttributeError(f"{type(self.scheduler).__name__} runs have no sigmas")
        return tc.tensor(self.tables.host["sigmas"])

    def set_begin_index(self, begin_index: int = 0) -> None:
        """Start at ``timesteps[begin_index]`` (image-to-image starts part-way down the schedule)."""
        if self.steps_taken:
            raise ValueError(f"set_begin_index: the run has already taken {self.steps_taken} steps")
        if not isinstance(begin_index, numbers.Integral) or not 0 <= begin_index < self.num_inference_steps:
            raise ValueError(f"set_begin_index: begin_index must be an int in [0, {self.num_inference_steps}), "
                             f"got {begin_index!r}")
        self.begin_index = self.position = int(begin_index)

    def step(self, model_output: tc.Tensor, timestep: Any, sample: tc.Tensor, *args: Any,
             **kwargs: Any) -> SchedulerOutput | tuple:
        """One step from ``timestep`` to the next; the scheduler's ``step`` arguments."""
        return self.scheduler._step(self, model_output, timestep, sample, *args, **kwargs)

    def prepare_step(self, sample: tc.Tensor, timestep: Any = None, **kwargs: Any) -> StepArgs:
        """The current step's ``StepArgs`` (nothing moves on yet): ``kwargs`` are the
        scheduler's ``step`` options (eta, generator, variance_noise, ...); ``timestep``,
        when given, is checked against the run's as ``step`` checks it."""
        return self.scheduler._prepare(self, self._position(timestep, "prepare_step"), sample, **kwargs)

    def finish_step(self, original: tc.Tensor | None) -> None:
        """Move on after a step whose x̂₀ was ``original`` (kept where the solver has history:
        ``scheduler.solver_history``; None is fine for the others)."""
        self._advance(self.scheduler._history_after(self, original))

    def step_values(self, position: int, device: str) -> tc.Tensor:
        """Row ``position`` of the run's step table on ``device`` (the table is uploaded once)."""
        return self.tables.get("steps", device)[position]

    def scale_model_input(self, sample: tc.Tensor, timestep: Any = None) -> tc.Tensor:
        """The model input for the current step (scaled where the scheduler needs it)."""
        return self.scheduler._scale_model_input(self, sample, timestep)

    def add_noise(self, original_samples: tc.Tensor, noise: tc.Tensor) -> tc.Tensor:
        """``original_samples`` noised to the level of the run's current step (image-to-image)."""
        return self.scheduler._add_noise_at(self, original_samples, noise)

    def timestep_at(self, position: int) -> int | float:
        """The host value of the run's timestep at ``position``."""
        return self.schedule[position].item()

    def _position(self, timestep: Any, op: str = "step") -> int:
        """The current position, after checking a step is left and ``timestep`` is its timestep.

        ``timestep`` is compared when it can be read without a device round trip (a
        number or a CPU tensor); a device tensor (or None) is taken to be the current one.
        """
        if self.finished:
            raise ValueError(f"{op}: the run has finished its {self.num_inference_steps} steps; "
                             f"start a new run (scheduler.start or set_timesteps)")
        value = None if timestep is None else host_value(timestep, op)
        expected = self.schedule[self.position]
        if value is None:
            return self.position
        # float schedules (Euler) compare in their float32; integer ones exactly
        same = expected.dtype.type(value) == expected if expected.dtype.kind == "f" else value == expected
        if not same:
            raise ValueError(f"{op}: timestep {value} is not the run's timestep {expected.item()} at step "
                             f"{self.position}; steps follow the run's timesteps in order "
                             f"(set_begin_index to start part-way)")
        return self.position

    def _advance(self, history: list[tc.Tensor] | None = None) -> None:
        """Move on one step, keeping ``history`` (the solver's recent outputs) if given."""
        if history is not None:
            self.history = history
        self.position += 1
        self.steps_taken += 1


def host_value(timestep: Any, op: str) -> int | float | None:
    """A timestep's value if it is on the host (a number, array or CPU tensor), else None."""
    if isinstance(timestep, tc.Tensor):
        if timestep.numel() != 1:
            raise ValueError(f"{op}: timestep must have one element, got shape {timestep.shape}")
        return timestep.item() if timestep.device == "cpu" else None
    if isinstance(timestep, np.ndarray | np.generic):
        if timestep.size != 1:
            raise ValueError(f"{op}: timestep must have one element, got shape {timestep.shape}")
        return timestep.item()
    if isinstance(timestep, numbers.Real) and not isinstance(timestep, bool):
        return timestep
    raise TypeError(f"{op}: timestep must be a number or a one-element tensor, got {type(timestep).__name__}")
