"""Packed convolution weights a CUDA-graph plan keeps instead of packing them per launch.

The implicit-GEMM forward packs its weight [Cout, C, R, S] channels-last on every call
(``conv_igemm``), and inside a captured graph on every launch: for the reference UNet
about 0.1 ms of each forward moves the same parameters again.  While a plan is captured
(``collecting``), a forward whose weight lies in memory the plan reads but never writes
(its modules' parameters) takes a packed copy from the plan's ``WeightPacks`` instead,
and the graph holds no pack of it.  Each copy keeps a snapshot of its weight's storage
version (``tensorcore/versions.py``); before each launch ``refresh`` packs again the
copies whose weight was written since (an optimizer step, ``copy_``, ``p[...] = v``,
``load_state_dict``, another plan writing its modules) or is shared with another library
through DLPack.  Writes into any other memory leave the copies alone.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

import cupy

from ...versions import Snapshot, WriteVersion
from ..geometry import extent
from . import pools

_active = threading.local()


class WeightPacks:
    """Packed copies of weights within ``spans`` ((lowest, past-the-end) device
    addresses and write version of each storage the plan never writes), and how to make
    each again."""

    def __init__(self, spans: list[tuple[int, int, WriteVersion]]) -> None:
        self.spans = spans
        # The copies' own pool: memory from the plan's pool that the capture freed is
        # reused by later captured kernels, which would overwrite a copy at each launch.
        self._pool = cupy.cuda.MemoryPool()
        pools.register(self, self._pool)
        self._held: dict[tuple, Any] = {}
        self._made_from = Snapshot()  # the versions of the weights' storages
        self._fills: list[list[Callable[[], None]]] = []  # per storage in the snapshot
        self.packed = 0  # copies made so far, first ones included

    def held(self, w: Any, key: tuple, shape: tuple[int, ...], fill: Callable[[Any], None]) -> Any | None:
        """The kept copy for weight ``w`` packed as ``key`` says, of ``shape`` (made by
        ``fill(copy)``), or None when ``w`` is not in memory the plan only reads."""
        lo, size = extent(w)
        version = next((v for start, end, v in self.spans if start <= lo and lo + size <= end), None)
        if version is None:
            return None
        found = self._held.get(key)
        if found is None:
            with cupy.cuda.using_allocator(self._pool.malloc):
                found = self._held[key] = cupy.empty(shape, dtype=w.dtype)
            position = self._made_from.track(version)  # the copy is made before the next launch
            if position == len(self._fills):
                self._fills.append([])
            self._fills[position].append(functools.partial(fill, found))
        return found

    def refresh(self) -> None:
        """Make again (on the current stream) the copies whose weight was written since."""
        if not self._made_from.stale():
            return
        for position in self._made_from.take():
            for fill in self._fills[position]:
                fill()
                self.packed += 1

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

