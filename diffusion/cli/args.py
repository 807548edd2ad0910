"""Argument types for the command line: each checks its value and says what it wants.

argparse calls them on the raw strings; an ``ArgumentTypeError`` becomes the one-line
message ``python -m diffusion <command>: error: argument --x: <message>``.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, NamedTuple


def _number(text: str, kind: type) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer >= ``low``."""
    def parse(text: str) -> int:
        value = _number(text, int)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def float_in(low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False
             ) -> Callable[[str], float]:
    """A finite number in the interval [low, high] (ends excluded where open)."""
    def parse(text: str) -> float:
        value = _number(text, float)
        if value < low or value > high or (low_open and value == low) or (high_open and value == high):
            left, right = "(" if low_open else "[", ")" if high_open or high == math.inf else "]"
            raise argparse.ArgumentTypeError(f"must be in {left}{low:g}, {high:g}{right}, got {text!r}")
        return value
    parse.__name__ = "number"
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
positive_float = float_in(0.0, low_open=True)
non_negative_float = float_in(0.0)
probability = float_in(0.0, 1.0, high_open=True)


def int_list(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers, e.g. ``32,64``."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    values = tuple(_number(p, int) for p in parts)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def digit_labels(text: str) -> tuple[int, ...]:
    """Digits to sample, e.g. ``0,3,7`` or ``0-9``."""
    values: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected digits like 0,3,7 or 0-9, got {text!r}") from None
        if not 0 <= first <= last <= 9:
            raise argparse.ArgumentTypeError(f"digits must lie in 0-9, got {text!r}")
        values.extend(range(first, last + 1))
    return tuple(values)


def pixel_size(text: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT`` in pixels, e.g. ``512x768``: multiples of 8, as the VAE halves each side three times."""
    width, _, height = text.lower().partition("x")
    try:
        size = int(width), int(height)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT such as 512x768, got {text!r}") from None
    if any(side < 8 or side % 8 for side in size):
        raise argparse.ArgumentTypeError(f"width and height must be positive multiples of 8, got {text!r}")
    return size


class LoraOption(NamedTuple):
    """One ``--lora FILE[:SCALE]``."""

    path: str
    scale: float


def lora_option(text: str) -> LoraOption:
    """``FILE[:SCALE]``: a ``.safetensors`` LoRA file and the weight it is applied with (default 1).

    The scale follows the last colon, so a path that holds colons still works."""
    path, colon, scale = text.rpartition(":")
    if not colon or scale.endswith(".safetensors"):
        path, scale = text, "1"
    if not path.endswith(".safetensors"):
        raise argparse.ArgumentTypeError(f"{path!r} is not a .safetensors file (LoRA weights are read from "
                                         f"safetensors only)")
    try:
        value = float(scale)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected FILE.safetensors[:SCALE] with SCALE a finite number, got {text!r}")
    return LoraOption(path, value)


class UsageError(ValueError):
    """An option, path or input the command refuses before it starts any work (exit status 2)."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")
