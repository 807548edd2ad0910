"""Sanity bounds on model configs, checked before a single module is built.

A config.json from a stranger decides how much a constructor allocates and how long it
runs, so a model class states what each key may hold and ``check_config`` refuses
anything else with a ValueError naming the key and the value:

- every bounded key has a kind: an int count, a width (a positive int), a list of
  widths or of names, a finite number, a flag, a name; a float where an int is needed,
  a non-list where a list is needed, a zero or negative count are refused;
- repetition counts (layers per block, the number of blocks) are at most
  ``MAX_REPEATS``: released diffusion and CLIP configs repeat a unit at most a few dozen
  times, and every repetition is Python work at construction time;
- widths are at most ``MAX_WIDTH``, and the parameters the config describes, counted
  from below by the class (``parameter_shares``), must fit the host's memory as float32
  (``tensorcore.sizes.memory_limit``); that message names the keys with the largest share.

New model classes give ``config_bounds`` (and ``parameter_shares``) as class attributes;
``@register_to_config`` then checks every construction, ``from_config`` and
``from_pretrained`` included.  Code outside that path calls ``check_config`` itself.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from tensorcore.sizes import memory_limit

MAX_REPEATS = 256
MAX_WIDTH = 2 ** 24

Bound = Callable[[Any], str | None]  # None when the value is acceptable, else what was expected
Shares = Callable[[Mapping[str, Any]], Mapping[tuple[str, ...], int]]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def count(low: int = 1, high: int = MAX_REPEATS) -> Bound:
    """An int in ``[low, high]``."""
    return lambda v: None if _is_int(v) and low <= v <= high else f"an int from {low} to {high}"


def width() -> Bound:
    """A positive int of at most ``MAX_WIDTH``."""
    return count(1, MAX_WIDTH)


def number() -> Bound:
    """A finite int or float."""
    return lambda v: None if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) \
        else "a finite number"


def flag() -> Bound:
    return lambda v: None if isinstance(v, bool) else "true or false"


def name() -> Bound:
    return lambda v: None if isinstance(v, str) else "a string"


def list_of(item: Bound, low: int = 1, high: int = MAX_REPEATS) -> Bound:
    """A list (or tuple) of ``low`` to ``high`` items, each passing ``item``."""
    expected = f"a list of {low if low == high else f'{low} to {high}'} items, each {item(None)}"
    return lambda v: None if isinstance(v, list | tuple) and low <= len(v) <= high \
        and all(item(x) is None for x in v) else expected


def size_or_pair() -> Bound:
    """A width or a list of two widths (``sample_size``)."""
    single, pair = width(), list_of(width(), 2, 2)
    return lambda v: None if single(v) is None or pair(v) is None else f"{single(None)} or {pair(None)}"


def optional(bound: Bound) -> Bound:
    """``bound`` or null."""
    return lambda v: None if v is None or bound(v) is None else f"null or {bound(v)}"


def check_config(owner: str, config: Mapping[str, Any], bounds: Mapping[str, Bound],
                 shares: Shares | None = None) -> None:
    """Raise ValueError naming the first key of ``config`` outside its bound, then, when
    ``shares`` is given, when the parameters it counts need more than the host's memory."""
    for key, bound in bounds.items():
        if key in config:
            expected = bound(config[key])
            if expected is not None:
                raise ValueError(f"{owner}: config key {key!r} must be {expected}, got {config[key]!r}")
    if shares is None:
        return
    counted = shares(config)
    nbytes, limit = 4 * sum(counted.values()), memory_limit()
    if nbytes > limit:
        keys = max(counted, key=counted.__getitem__)
        culprit = ", ".join(f"{k}={config.get(k)!r}" for k in keys)
        raise ValueError(f"{owner}: the config describes at least {nbytes // 4:,} parameters ({nbytes:,} bytes as "
                         f"float32), more than the {limit:,} bytes of memory of this machine; most come from {culprit}")


def conv_net_shares(config: Mapping[str, Any]) -> dict[tuple[str, ...], int]:
    """A lower bound on the parameters of an encoder-decoder of 3x3 convolutions: level ``i``
    holds at least ``layers_per_block`` convolutions on the way down and one more on the way
    up, each of ``block_out_channels[i]`` channels in and out, and the stem and head
    convolutions connect the image channels to the first level."""
    channels, layers = config["block_out_channels"], config["layers_per_block"]
    return {
        ("block_out_channels", "layers_per_block"): sum(9 * c * c * (2 * layers + 1) for c in channels),
        ("in_channels",): 9 * config["in_channels"] * channels[0],
        ("out_channels",): 9 * config["out_channels"] * channels[0],
    }
