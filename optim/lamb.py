"""LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning", Algorithm 2)."""

from __future__ import annotations

from typing import Any, Iterable

from . import checks
from .flat import Segment
from .optimizer import Optimizer


class LAMB(Optimizer):
    """Adam's bias-corrected direction r = m̂ / (√v̂ + eps) plus decoupled weight decay,
    u = r + wd·p, scaled per tensor by the trust ratio ‖p‖ / ‖u‖ (1 when either norm
    is zero): p -= lr · ‖p‖/‖u‖ · u."""

    elementwise = False  # per-parameter norms

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def check_group(self, group: dict[str, Any]) -> None:
        checks.betas("LAMB", group["betas"])
        checks.non_negative("LAMB", "eps", group["eps"])
        checks.non_negative("LAMB", "weight_decay", group["weight_decay"])

    def state_spec(self, group: dict[str, Any]) -> dict[str, float]:
        return {"exp_avg": 0.0, "exp_avg_sq": 0.0}

    def update(self, backend: Any, segment: Segment, first: int, last: int, group: dict[str, Any],
               step: Any) -> None:
        beta1, beta2 = group["betas"]
        backend.lamb_update_(segment.section("param", first, last), segment.section("grad", first, last),
                             segment.section("exp_avg", first, last), segment.section("exp_avg_sq", first, last),
                             segment.ranges(first, last), segment.lr, step, beta1, beta2, group["eps"],
                             group["weight_decay"])
