"""Stochastic gradient descent with momentum, dampening, Nesterov and weight decay."""

from __future__ import annotations

from typing import Any, Iterable

from tensorcore import tracing

from . import checks
from .flat import Segment
from .optimizer import Optimizer


class SGD(Optimizer):
    """``torch.optim.SGD``: d = g + wd·p; buf = d on the first step, else
    momentum·buf + (1 - dampening)·d; p -= lr·(d + momentum·buf if nesterov else buf)."""

    uses_step = False

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov))

    def check_group(self, group: dict[str, Any]) -> None:
        checks.non_negative("SGD", "momentum", group["momentum"])
        checks.non_negative("SGD", "dampening", group["dampening"])
        checks.non_negative("SGD", "weight_decay", group["weight_decay"])
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("SGD: Nesterov momentum requires a momentum > 0 and zero dampening, got "
                             f"momentum={group['momentum']}, dampening={group['dampening']}")

    def state_spec(self, group: dict[str, Any]) -> dict[str, float]:
        return {"momentum_buffer": 0.0} if group["momentum"] != 0 else {}

    def update(self, backend: Any, segment: Segment, first: int, last: int, group: dict[str, Any],
               step: Any) -> None:
        momentum = group["momentum"]
        buf = segment.section("momentum_buffer", first, last) if momentum != 0 else None
        is_first = segment.counts[first] == 0
        tracing.guard(lambda: (segment.counts[first] == 0) == is_first)  # a replay repeats this choice
        first_step = segment.one if is_first else segment.zero
        backend.sgd_update_(segment.section("param", first, last), segment.section("grad", first, last), buf,
                            segment.lr, momentum, group["dampening"], bool(group["nesterov"]),
                            group["weight_decay"], first_step)
