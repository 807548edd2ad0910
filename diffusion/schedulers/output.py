"""What a scheduler step returns."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import tensorcore as tc


@dataclass
class SchedulerOutput:
    """The result of one step (diffusers' ``SchedulerOutput`` / ``DDIMSchedulerOutput``).

    ``prev_sample`` is x at the next (less noisy) timestep, the next model input;
    ``pred_original_sample`` is the step's prediction of the clean sample x̂₀.
    ``out[0]`` and ``out["prev_sample"]`` also work, as on diffusers' outputs.
    """

    prev_sample: tc.Tensor
    pred_original_sample: tc.Tensor | None = None

    def to_tuple(self) -> tuple[tc.Tensor, ...]:
        """The fields that are set, in order (what ``step(..., return_dict=False)`` returns)."""
        return tuple(v for v in (getattr(self, f.name) for f in fields(self)) if v is not None)

    def __getitem__(self, key: int | str) -> Any:
        return getattr(self, key) if isinstance(key, str) else self.to_tuple()[key]


class LCMSchedulerOutput(SchedulerOutput):
    """An LCM step's result (diffusers' ``LCMSchedulerOutput``): ``denoised`` is the step's
    consistency-model estimate of the clean sample; ``pred_original_sample`` names it too."""

    def __init__(self, prev_sample: tc.Tensor, denoised: tc.Tensor | None = None) -> None:
        super().__init__(prev_sample, denoised)

    @property
    def denoised(self) -> tc.Tensor | None:
        return self.pred_original_sample
