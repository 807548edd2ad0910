"""Adam (with AMSGrad) and AdamW: one fused backend call per (group, dtype)."""

from __future__ import annotations

from typing import Any, Iterable

from . import checks
from .flat import Segment
from .optimizer import Optimizer


class Adam(Optimizer):
    """``torch.optim.Adam``: weight decay is added to the gradient (L2)."""

    decoupled = False

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad))

    def check_group(self, group: dict[str, Any]) -> None:
        checks.betas(self._name, group["betas"])
        checks.non_negative(self._name, "eps", group["eps"])
        checks.non_negative(self._name, "weight_decay", group["weight_decay"])

    def state_spec(self, group: dict[str, Any]) -> dict[str, float]:
        spec = {"exp_avg": 0.0, "exp_avg_sq": 0.0}
        if group["amsgrad"]:
            spec["max_exp_avg_sq"] = 0.0
        return spec

    def update(self, backend: Any, segment: Segment, first: int, last: int, group: dict[str, Any],
               step: Any) -> None:
        beta1, beta2 = group["betas"]
        vmax = segment.section("max_exp_avg_sq", first, last) if group["amsgrad"] else None
        backend.adam_update_(segment.section("param", first, last), segment.section("grad", first, last),
                             segment.section("exp_avg", first, last), segment.section("exp_avg_sq", first, last),
                             vmax, segment.lr, step, beta1, beta2, group["eps"], group["weight_decay"],
                             self.decoupled)


class AdamW(Adam):
    """``torch.optim.AdamW``: decoupled weight decay, p *= 1 - lr·wd before the Adam step."""

    decoupled = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad)
