"""Adagrad with learning-rate decay."""

from __future__ import annotations

from typing import Any, Iterable

from . import checks
from .flat import Segment
from .optimizer import Optimizer


class Adagrad(Optimizer):
    """``torch.optim.Adagrad``: sum += g²; p -= lr / (1 + (step-1)·lr_decay) · g / (√sum + eps)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10) -> None:
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, eps=eps))

    def check_group(self, group: dict[str, Any]) -> None:
        for option in ("lr_decay", "weight_decay", "initial_accumulator_value", "eps"):
            checks.non_negative("Adagrad", option, group[option])

    def state_spec(self, group: dict[str, Any]) -> dict[str, float]:
        return {"sum": float(group["initial_accumulator_value"])}

    def update(self, backend: Any, segment: Segment, first: int, last: int, group: dict[str, Any],
               step: Any) -> None:
        backend.adagrad_update_(segment.section("param", first, last), segment.section("grad", first, last),
                                segment.section("sum", first, last), segment.lr, step, group["lr_decay"],
                                group["weight_decay"], group["eps"])
