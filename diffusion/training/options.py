"""The options every training loop shares, checked once when they are given."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable


@dataclass
class TrainOptions:
    """How long and how to train; see ``train_ddpm`` for what each option does."""

    steps: int = 3000
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 100
    min_lr: float = 0.0
    grad_clip: float | None = 1.0
    ema_decay: float = 0.999
    checkpoint_every: int | None = 500
    keep_checkpoints: int = 2
    out_dir: str | None = None
    resume: str | bool | None = None
    seed: int = 0
    log_every: int = 10
    progress: bool = True
    callback: Callable[[int], Any] | None = None
    compile: bool | str = "auto"

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "log_every"):
            _int_at_least(name, getattr(self, name), 1)
        for name in ("warmup_steps", "seed"):
            _int_at_least(name, getattr(self, name), 0)
        _int_at_least("keep_checkpoints", self.keep_checkpoints, 1)
        if self.checkpoint_every is not None:
            _int_at_least("checkpoint_every", self.checkpoint_every, 1)
        _number_at_least("lr", self.lr, 0.0, strict=True)
        _number_at_least("weight_decay", self.weight_decay, 0.0)
        _number_at_least("min_lr", self.min_lr, 0.0)
        if self.min_lr > self.lr:
            raise ValueError(f"training: min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        if self.grad_clip is not None:
            _number_at_least("grad_clip", self.grad_clip, 0.0, strict=True)
        if not (isinstance(self.ema_decay, (int, float)) and 0.0 <= self.ema_decay < 1.0):
            raise ValueError(f"training: ema_decay must be in [0, 1), got {self.ema_decay!r}")
        if len(tuple(self.betas)) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"training: betas must be two numbers in [0, 1), got {self.betas!r}")
        self.betas = (float(self.betas[0]), float(self.betas[1]))
        if self.out_dir is not None:
            self.out_dir = os.fspath(self.out_dir)
        if self.resume is not None and self.resume is not False:
            if self.resume is True and self.out_dir is None:
                raise ValueError("training: resume=True continues from out_dir's latest checkpoint, "
                                 "but out_dir is None")
            if self.resume is not True:
                self.resume = os.fspath(self.resume)
        if not (self.compile is True or self.compile is False or self.compile == "auto"):
            raise ValueError(f"training: compile must be True, False or 'auto', got {self.compile!r}")
        if self.callback is not None and not callable(self.callback):
            raise TypeError(f"training: callback must be callable, got {type(self.callback).__name__}")

    def describe(self) -> dict[str, Any]:
        """The options as JSON-friendly data (for checkpoints), the callback left out."""
        return {k: v for k, v in asdict(self).items() if k != "callback"}


def split_options(kwargs: dict[str, Any]) -> tuple[TrainOptions, dict[str, Any]]:
    """``TrainOptions`` built from the keys it knows; the other keys are returned."""
    names = {f.name for f in fields(TrainOptions)}
    return TrainOptions(**{k: v for k, v in kwargs.items() if k in names}), \
        {k: v for k, v in kwargs.items() if k not in names}


def _int_at_least(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"training: {name} must be an int >= {low}, got {value!r}")


def _number_at_least(name: str, value: Any, low: float, strict: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or (strict and value == low):
        raise ValueError(f"training: {name} must be a finite number {'>' if strict else '>='} {low:g}, "
                         f"got {value!r}")
