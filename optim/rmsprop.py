"""RMSProp, plain or centered, with optional momentum."""

from __future__ import annotations

from typing import Any, Iterable

from . import checks
from .flat import Segment
from .optimizer import Optimizer


class RMSprop(Optimizer):
    """``torch.optim.RMSprop``: sq = α·sq + (1-α)·g²; centered subtracts the squared
    running mean of g; p -= lr·g / (√sq + eps), through a momentum buffer if momentum > 0."""

    uses_step = False

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False) -> None:
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered))

    def check_group(self, group: dict[str, Any]) -> None:
        checks.non_negative("RMSprop", "alpha", group["alpha"])
        checks.non_negative("RMSprop", "eps", group["eps"])
        checks.non_negative("RMSprop", "weight_decay", group["weight_decay"])
        checks.non_negative("RMSprop", "momentum", group["momentum"])

    def state_spec(self, group: dict[str, Any]) -> dict[str, float]:
        spec = {"square_avg": 0.0}
        if group["momentum"] > 0:
            spec["momentum_buffer"] = 0.0
        if group["centered"]:
            spec["grad_avg"] = 0.0
        return spec

    def update(self, backend: Any, segment: Segment, first: int, last: int, group: dict[str, Any],
               step: Any) -> None:
        grad_avg = segment.section("grad_avg", first, last) if group["centered"] else None
        buf = segment.section("momentum_buffer", first, last) if group["momentum"] > 0 else None
        backend.rmsprop_update_(segment.section("param", first, last), segment.section("grad", first, last),
                                segment.section("square_avg", first, last), grad_avg, buf, segment.lr,
                                group["alpha"], group["eps"], group["weight_decay"], group["momentum"],
                                bool(group["centered"]))
