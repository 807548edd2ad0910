"""One layer's LoRA adapter as a file gives it: the two factors and an optional alpha."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LoraWeights:
    """The update ``up @ down`` a LoRA adds to one layer's weight, scaled by ``alpha / rank``.

    ``down`` is ``[rank, in]`` for a Linear, ``[rank, in, kh, kw]`` for a Conv2d (PEFT's
    ``lora_A``, kohya's ``lora_down``); ``up`` is ``[out, rank]`` or ``[out, rank, 1, 1]``
    (``lora_B``, ``lora_up``).  ``alpha`` None means no alpha was given: the update counts
    in full (scale 1), as diffusers applies a PEFT LoRA saved without one.  ``key`` is the
    file's key of ``down``, for messages.
    """

    down: np.ndarray
    up: np.ndarray
    alpha: float | None
    key: str

    @property
    def rank(self) -> int:
        return self.down.shape[0]

    @property
    def scale(self) -> float:
        """How much of ``up @ down`` the layer adds at adapter weight 1."""
        return 1.0 if self.alpha is None else self.alpha / self.rank
