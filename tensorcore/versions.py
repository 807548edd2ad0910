"""Write versions: how often the engine has written each storage, as PyTorch's ``_version``.

A storage is the array at the end of an array's chain of views (``storage``); every
view of it -- a Tensor, its ``detach()``, what a movement op or ``x[i]`` returns, a
parameter inside an optimizer's flat buffer -- reads the same ``WriteVersion``.  Every
write the engine makes into existing memory calls ``bump`` on what it wrote, once the
write is issued: the in-place Tensor methods and ``__setitem__``, gradient accumulation,
BatchNorm's running statistics, optimizer updates, gradient clipping, and a compiled
plan's replay for the module state and arguments it writes.

What is derived from memory (a CUDA-graph plan's packed convolution weights) keeps a
``Snapshot`` of the versions it was made from and is made again only when one of them
moved.  Memory shared with another library through DLPack (exported or imported) may
be written where the engine cannot see it: such a storage is marked ``shared`` and a
snapshot of it is never current.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any


class WriteVersion:
    """The write count of one storage, and whether another library may write it."""

    __slots__ = ("value", "shared")

    def __init__(self) -> None:
        self.value = 0
        self.shared = False

    def bump(self) -> None:
        """Count one write."""
        with _lock:
            self.value += 1


_lock = threading.RLock()  # the registry and every count (re-entered when a dropped storage is forgotten)
_versions: dict[int, tuple[weakref.ref, WriteVersion]] = {}  # id(storage) -> (storage, its version)


def storage(a: Any) -> Any:
    """The array whose memory ``a`` views (``a`` itself when it views none).  Arrays
    whose buffer is held by a non-array object end the chain as owners do."""
    while isinstance(getattr(a, "base", None), type(a)):
        a = a.base
    return a


def counter(a: Any) -> WriteVersion:
    """The write version of ``a``'s storage, made on first use."""
    root = storage(a)
    key = id(root)
    with _lock:
        entry = _versions.get(key)
        if entry is not None and entry[0]() is root:
            return entry[1]
        found = WriteVersion()
        _register(root, found)
        return found


def _register(root: Any, found: WriteVersion) -> None:
    """Under the lock: ``root``'s version is ``found`` while ``root`` lives."""
    key = id(root)
    _versions[key] = (weakref.ref(root, lambda ref: _forget(key, ref)), found)


def _forget(key: int, ref: weakref.ref) -> None:
    with _lock:
        entry = _versions.get(key)
        if entry is not None and entry[0] is ref:
            del _versions[key]


def version(a: Any) -> int:
    """How many writes the engine made into ``a``'s storage."""
    root = storage(a)
    entry = _versions.get(id(root))
    return entry[1].value if entry is not None and entry[0]() is root else 0


def bump(*arrays: Any) -> None:
    """Count one write into each of ``arrays`` (call it after issuing the write)."""
    with _lock:
        for a in arrays:
            counter(a).value += 1


def continue_from(a: Any, previous: Any) -> None:
    """Make ``a``'s new storage count on from ``previous``'s (a tensor whose write gave it
    new memory keeps one history) and count the write."""
    found = counter(previous)
    with _lock:
        _register(storage(a), found)
        found.value += 1


def mark_shared(a: Any) -> None:
    """Note that another library holds ``a``'s memory and may write it unseen."""
    counter(a).shared = True


class Snapshot:
    """The versions something derived from memory was made from; ``stale`` until taken."""

    __slots__ = ("versions", "seen")

    def __init__(self, versions: list[WriteVersion]) -> None:
        self.versions = versions
        self.seen: list[int] | None = None

    def stale(self) -> bool:
        """Whether a source was written (or is shared) since ``take``, or never taken."""
        if self.seen is None:
            return True
        return any(v.shared or v.value != seen for v, seen in zip(self.versions, self.seen))

    def take(self) -> None:
        """Record the sources' versions now: call it before deriving again, so a write
        that lands meanwhile leaves the snapshot stale."""
        self.seen = [v.value for v in self.versions]
