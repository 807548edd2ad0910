"""The CuPy backend's memory pools besides CuPy's default one, for ``tc.cuda``'s counters.

A captured plan (``executor.CudaGraphReplay``) and the packed weights it keeps
(``weight_packs.WeightPacks``) allocate from pools of their own.  ``register`` records
such a pool for as long as its owner lives; ``private_pools`` lists those of the owners
still alive, so ``tc.cuda.memory_allocated`` and ``memory_reserved`` count every byte
the engine holds on the device, not only the default pool's.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

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
