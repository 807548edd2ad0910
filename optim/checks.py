"""Option checks shared by the optimizers: each raises a ValueError naming the
optimizer, the option and the value."""

from __future__ import annotations

import math
from typing import Any


def non_negative(name: str, option: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise ValueError(f"{name}: invalid {option} {value!r} (expected a number >= 0)")


def positive(name: str, option: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        raise ValueError(f"{name}: invalid {option} {value!r} (expected a number > 0)")


def unit_interval(name: str, option: str, value: Any) -> None:
    """0 <= value < 1, as for a momentum coefficient or a decay rate."""
    if not isinstance(value, (int, float)) or math.isnan(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name}: invalid {option} {value!r} (expected 0 <= {option} < 1)")


def betas(name: str, value: Any) -> None:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{name}: betas must be a pair (beta1, beta2), got {value!r}")
    unit_interval(name, "beta1", value[0])
    unit_interval(name, "beta2", value[1])
