"""Packed convolution weights a CUDA-graph plan keeps instead of packing them per launch.

The implicit-GEMM forward packs its weight [Cout, C, R, S] channels-last on every call
(``conv_igemm``), and inside a captured graph on every launch: for the reference UNet
about 0.1 ms of each forward moves the same parameters again.  While a plan is captured
(``collecting``), a forward whose weight lies in memory the plan reads but never writes
(its modules' parameters) takes a packed copy from the plan's ``WeightPacks`` instead,
and the graph holds no pack of it.  Before each launch ``refresh`` packs the copies
again if any write into device memory was noted since the last time
(``tensorcore.writes``): an optimizer step, ``copy_``, ``load_state_dict``, another
plan writing its modules; otherwise it costs one comparison.  The plan's own writes
(a compiled training step updating its parameters around frozen convolutions) leave
the copies current.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

import cupy

from ...writes import note_write_after, writes
from ..geometry import extent

_active = threading.local()


class WeightPacks:
    """Packed copies of weights within ``spans`` ((lowest, past-the-end) device
    addresses: memory the plan never writes), and how to make each again."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        self.spans = spans
        # The copies' own pool: memory from the plan's pool that the capture freed is
        # reused by later captured kernels, which would overwrite a copy at each launch.
        self._pool = cupy.cuda.MemoryPool()
        self._held: dict[tuple, Any] = {}
        self._fills: list[Callable[[], None]] = []
        self.written: int | None = None  # writes() when the copies were last made

    def held(self, w: Any, key: tuple, shape: tuple[int, ...], fill: Callable[[Any], None]) -> Any | None:
        """The kept copy for weight ``w`` packed as ``key`` says, of ``shape`` (made by
        ``fill(copy)``), or None when ``w`` is not in memory the plan only reads."""
        lo, size = extent(w)
        if not any(start <= lo and lo + size <= end for start, end in self.spans):
            return None
        found = self._held.get(key)
        if found is None:
            with cupy.cuda.using_allocator(self._pool.malloc):
                found = self._held[key] = cupy.empty(shape, dtype=w.dtype)
            self._fills.append(functools.partial(fill, found))
            self.written = None  # a new copy: made before the next launch
        return found

    def refresh(self) -> None:
        """Make the copies again (on the current stream) when memory was written since."""
        now = writes()
        if now != self.written:
            for fill in self._fills:
                fill()
            self.written = now

    def note_plan_write(self) -> None:
        """Note a launch of the plan that wrote its modules' memory (a write every other
        plan sees): the copies are of memory the plan never writes, so they stay
        current unless another write came since they were made."""
        now = note_write_after(self.written)
        if now is not None:
            self.written = now

    def __len__(self) -> int:
        return len(self._held)


def active() -> WeightPacks | None:
    """The plan being captured on this thread, if it keeps packed weights."""
    return getattr(_active, "packs", None)


@contextlib.contextmanager
def collecting(packs: WeightPacks) -> Iterator[None]:
    """Forwards called inside take their weights' packed copies from ``packs``."""
    before = active()
    _active.packs = packs
    try:
        yield
    finally:
        _active.packs = before

