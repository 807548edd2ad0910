"""Parameter: a Tensor that a Module registers as trainable."""

from __future__ import annotations

from typing import Any

from tensorcore import Tensor


class Parameter(Tensor):
    """A leaf tensor that requires grad by default and is found by ``Module.parameters()``.

    ``bounds`` = (low, high) (either may be None) is a constraint the optimizers apply
    inside their fused step, e.g. DiffusionConv keeps its diffusion times >= 1e-6.
    """

    def __init__(self, data: Any, requires_grad: bool = True, bounds: tuple[float | None, float | None] | None = None) -> None:
        if isinstance(data, Tensor):
            device, data = data.device, data.data
        else:
            device = "cpu"
        super().__init__(data, device, requires_grad)
        self.bounds = bounds

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()
