"""The CuPy backend's memory pools besides CuPy's default one, for ``tc.cuda``'s counters.

A captured plan (``executor.CudaGraphReplay``) and the packed weights it keeps
(``weight_packs.WeightPacks``) allocate from pools of their own.  ``register`` records
such a pool for as long as its owner lives; ``private_pools`` lists those of the owners
still alive, so ``tc.cuda.memory_allocated`` and ``memory_reserved`` count every byte
the engine holds on the device, not only the default pool's.

While a plan is captured into its own pool (``capturing_plan``), a kernel's temporary
buffers may simply be allocated and dropped: the pool keeps a freed block for the graph
and hands it to later captured kernels in stream order.  Outside such a capture they
come from buffers kept per stream (a user's graph captured from the default pool would
see a freed block reused by work outside it).
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import weakref
from typing import Any, Iterator

_owners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # owner -> its pool
_lock = threading.Lock()


def register(owner: Any, pool: Any) -> None:
    """Count ``pool`` (a ``cupy.cuda.MemoryPool``) while ``owner`` lives."""
    with _lock:
        _owners[owner] = pool


def private_pools() -> list[Any]:
    """The registered pools whose owners are alive."""
    with _lock:
        return list(_owners.values())


_capture = threading.local()


@contextlib.contextmanager
def capturing_plan() -> Iterator[None]:
    """Calls made inside are being captured into a plan's own pool (see above)."""
    before = plan_capture()
    _capture.active = True
    try:
        yield
    finally:
        _capture.active = before


def plan_capture() -> bool:
    """Whether this thread is capturing a plan into its own pool."""
    return getattr(_capture, "active", False)


class CaptureArena:
    """First-fit allocation inside one block of a plan's pool, for the plan's capture.

    CuPy's pool serves each request from a free block of at least its size and merges
    only neighbours of one device allocation, so the blocks a capture frees and reuses
    fragment: the SD-1.5 UNet's plan, whose largest live set is 80 MB, reserved 165 MB.
    Here every allocation takes the lowest free range that fits inside one block sized
    from the plan's own placement (``Plan.arena_bytes``), and a freed range merges with
    its free neighbours at once; a request that does not fit goes to the pool."""

    def __init__(self, pool: Any, nbytes: int, align: int = 256) -> None:
        import cupy

        self.pool, self.align = pool, align
        self.device = cupy.cuda.runtime.getDevice()
        self.block = pool.malloc(nbytes)
        self.free: list[list[int]] = [[0, nbytes]]  # [offset, size], by offset, never adjacent
        self.lock = threading.RLock()  # arrays may die on any thread (RLock: a collection may run inside malloc)

    def malloc(self, nbytes: int) -> Any:
        """A ``cupy.cuda.MemoryPointer`` to ``nbytes`` (the allocator of ``using_allocator``)."""
        import cupy

        size = -(-nbytes // self.align) * self.align
        if size == 0:
            return self.pool.malloc(0)
        with self.lock:
            for i, (offset, room) in enumerate(self.free):
                if room >= size:
                    if room == size:
                        del self.free[i]
                    else:
                        self.free[i] = [offset + size, room - size]
                    lease = _Lease(self, offset, size)
                    break
            else:
                return self.pool.malloc(nbytes)
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(self.block.ptr + offset, size, lease, self.device), 0)

    def give_back(self, offset: int, size: int) -> None:
        """Return a range, merged with the free ranges it touches."""
        with self.lock:
            free = self.free
            i = bisect.bisect(free, [offset, size])
            if i < len(free) and free[i][0] == offset + size:  # the next free range
                size += free.pop(i)[1]
            if i and free[i - 1][0] + free[i - 1][1] == offset:  # the previous one
                free[i - 1][1] += size
            else:
                free.insert(i, [offset, size])


class _Lease:
    """One allocation of a ``CaptureArena``: its range is free again when the memory
    object holding this lease is collected."""

    __slots__ = ("arena", "offset", "size")

    def __init__(self, arena: CaptureArena, offset: int, size: int) -> None:
        self.arena, self.offset, self.size = arena, offset, size

    def __del__(self) -> None:
        self.arena.give_back(self.offset, self.size)
