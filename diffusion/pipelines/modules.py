"""Small facts about the models a pipeline holds, whether plain or compiled."""

from __future__ import annotations

from typing import Any


def unwrapped(model: Any) -> Any:
    """The module behind a compiled callable (``tc.compile`` keeps it as ``__wrapped__``)."""
    return getattr(model, "__wrapped__", model)


def model_device(module: Any) -> str:
    """The device of a module's parameters."""
    return next(iter(unwrapped(module).parameters())).device
