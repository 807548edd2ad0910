"""``tc.chain(stage1, stage2, ...)``: compiled stages run in sequence, each output feeding the next.

    stages = tc.chain(encoder, unet, vae.decode)
    out = stages(x, side_inputs=[None, {"timestep": t, "class_labels": labels}, {}])
    out = await stages.call_async(x, side_inputs=[None, {"timestep": t, "class_labels": labels}, {}])

The chain's positional arguments go to the first stage; every later stage takes the
previous stage's output as its first argument.  ``side_inputs`` holds one dict of
keyword arguments per stage (None or {} for none).  Each stage is a ``tc.compile``
callable with its own plans: its own keys and structure versions (a stage whose module
changed retraces alone) and its own eager fallbacks (a stage that runs eagerly leaves
the others replaying).  A plain function or Module given as a stage is compiled with the
default options; pass ``tc.compile(stage, ...)`` to choose them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from . import asynchronous
from .host import CacheInfo, Compiled


class Chain:
    """Stages called in sequence, synchronously (``chain(...)``) or under asyncio (``chain.call_async``)."""

    def __init__(self, *stages: Callable) -> None:
        if not stages:
            raise ValueError("chain: expected at least one stage")
        for i, stage in enumerate(stages):
            if not callable(stage):
                raise TypeError(f"chain: stage {i} must be a compiled callable, a function or a Module, "
                                f"got {type(stage).__name__}")
        self.stages: tuple[Compiled, ...] = tuple(s if isinstance(s, Compiled) else Compiled(s) for s in stages)

    def _bound(self, side_inputs: Sequence[Mapping[str, Any] | None] | None) -> list[Callable]:
        """Each stage with its side inputs bound, after checking them all."""
        n = len(self.stages)
        if side_inputs is None:
            side_inputs = [None] * n
        if isinstance(side_inputs, (str, bytes, Mapping)) or not isinstance(side_inputs, Sequence):
            raise TypeError(f"chain: side_inputs must be a list of {n} dicts (or None), "
                            f"got {type(side_inputs).__name__}")
        if len(side_inputs) != n:
            raise ValueError(f"chain: side_inputs must hold one entry per stage ({n}), got {len(side_inputs)}")
        bound = []
        for i, (stage, side) in enumerate(zip(self.stages, side_inputs)):
            if side is None:
                side = {}
            if not isinstance(side, Mapping) or not all(isinstance(k, str) for k in side):
                raise TypeError(f"chain: side_inputs[{i}] must be a dict of keyword arguments or None, got {side!r}")
            bound.append(functools.partial(stage, **side) if side else stage)
        return bound

    def __call__(self, *args: Any, side_inputs: Sequence[Mapping[str, Any] | None] | None = None) -> Any:
        """Run every stage in order; returns the last stage's output."""
        first, *rest = self._bound(side_inputs)
        out = first(*args)
        for stage in rest:
            out = stage(out)
        return out

    async def call_async(self, *args: Any, side_inputs: Sequence[Mapping[str, Any] | None] | None = None) -> Any:
        """``chain(...)`` under asyncio, bit-identical to it: on CuPy the stages are queued on
        the chain's stream back to back; on the CPU they run in the chain's worker thread.
        A cancellation stops the chain at the next stage boundary (see ``asynchronous``)."""
        stages = self._bound(side_inputs)
        first_side = (side_inputs or [None])[0] or {}
        return await asynchronous.lane(self).run(stages, args, asynchronous.call_device(args, dict(first_side)))

    def cache_info(self) -> tuple[CacheInfo, ...]:
        """Each stage's ``cache_info()``, in order."""
        return tuple(stage.cache_info() for stage in self.stages)

    def release(self) -> None:
        """Free every stage's plans."""
        for stage in self.stages:
            stage.release()

    def __len__(self) -> int:
        return len(self.stages)

    def __repr__(self) -> str:
        return "tc.chain(" + ", ".join(stage.label for stage in self.stages) + ")"


def chain(*stages: Callable) -> Chain:
    """Compiled stages run in sequence, the output of one feeding the next (see ``Chain``)."""
    return Chain(*stages)
