"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms")."""

from __future__ import annotations

from typing import Any, Iterable

from . import checks
from .flat import Segment
from .optimizer import Optimizer


class Lion(Optimizer):
    """p *= 1 - lr·wd; p -= lr·sign(β1·m + (1-β1)·g); m = β2·m + (1-β2)·g."""

    uses_step = False

    def __init__(self, params: Iterable[Any], lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    def check_group(self, group: dict[str, Any]) -> None:
        checks.betas("Lion", group["betas"])
        checks.non_negative("Lion", "weight_decay", group["weight_decay"])

    def state_spec(self, group: dict[str, Any]) -> dict[str, float]:
        return {"exp_avg": 0.0}

    def update(self, backend: Any, segment: Segment, first: int, last: int, group: dict[str, Any],
               step: Any) -> None:
        beta1, beta2 = group["betas"]
        backend.lion_update_(segment.section("param", first, last), segment.section("grad", first, last),
                             segment.section("exp_avg", first, last), segment.lr, beta1, beta2,
                             group["weight_decay"])
