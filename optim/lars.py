"""LARS (You, Gitman & Ginsburg 2017, "Large Batch Training of Convolutional Networks", Algorithm 1)."""

from __future__ import annotations

from typing import Any, Iterable

from . import checks
from .flat import Segment
from .optimizer import Optimizer


class LARS(Optimizer):
    """Per-tensor local lr λ = η‖p‖ / (‖g‖ + wd‖p‖ + eps) (1 when ‖p‖ or ‖g‖ is zero);
    buf = momentum·buf + lr·λ·(g + wd·p); p -= buf."""

    uses_step = False
    elementwise = False  # per-parameter norms

    def __init__(self, params: Iterable[Any], lr: float = 1e-1, momentum: float = 0.9, weight_decay: float = 0.0,
                 trust_coefficient: float = 1e-3, eps: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, eps=eps))

    def check_group(self, group: dict[str, Any]) -> None:
        checks.non_negative("LARS", "momentum", group["momentum"])
        checks.non_negative("LARS", "weight_decay", group["weight_decay"])
        checks.positive("LARS", "trust_coefficient", group["trust_coefficient"])
        checks.non_negative("LARS", "eps", group["eps"])

    def state_spec(self, group: dict[str, Any]) -> dict[str, float]:
        return {"momentum_buffer": 0.0}

    def update(self, backend: Any, segment: Segment, first: int, last: int, group: dict[str, Any],
               step: Any) -> None:
        backend.lars_update_(segment.section("param", first, last), segment.section("grad", first, last),
                             segment.section("momentum_buffer", first, last), segment.ranges(first, last),
                             segment.lr, group["momentum"], group["weight_decay"], group["trust_coefficient"],
                             group["eps"])
