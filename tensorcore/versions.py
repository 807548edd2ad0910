"""Write versions: how often the engine has written each storage, as PyTorch's ``_version``.

A storage is the array at the end of an array's chain of views (``storage``); every
view of it -- a Tensor, its ``detach()``, what a movement op or ``x[i]`` returns, a
parameter inside an optimizer's flat buffer -- reads the same ``WriteVersion``.  Every
write the engine makes into existing memory calls ``bump`` on what it wrote, once the
write is issued: the in-place Tensor methods and ``__setitem__``, gradient accumulation,
BatchNorm's running statistics, optimizer updates, gradient clipping, and a compiled
plan's replay for the module state and arguments it writes.

What is derived from memory (a CUDA-graph plan's packed convolution weights) keeps a
``Snapshot`` of the storages it was made from; each write into one of them marks it
moved there, so asking whether anything must be made again costs one test however many
storages it reads.  Memory shared with another library through DLPack (exported or
imported) may be written where the engine cannot see it: such a storage is marked
``shared`` and reads as moved in every snapshot from then on.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_lock = threading.RLock()  # the registry, every count and every snapshot's moved set
_versions: dict[int, tuple[weakref.ref, "WriteVersion"]] = {}  # id(storage) -> (storage, its version)


class WriteVersion:
    """The write count of one storage, whether another library may write it, and the
    snapshots to tell of each write."""

    __slots__ = ("value", "shared", "watchers")

    def __init__(self) -> None:
        self.value = 0
        self.shared = False
        self.watchers: list[tuple[weakref.ref, int]] = []  # (snapshot, this storage's position in it)

    def bump(self) -> None:
        """Count one write."""
        with _lock:
            self._moved()

    def _moved(self) -> None:
        """Under the lock: count a write and mark it in the snapshots still alive."""
        self.value += 1
        if self.watchers:
            alive = []
            for ref, position in self.watchers:
                snapshot = ref()
                if snapshot is not None:
                    snapshot.moved.add(position)
                    alive.append((ref, position))
            self.watchers = alive


def storage(a: Any) -> Any:
    """The array whose memory ``a`` views (``a`` itself when it views none).  Arrays
    whose buffer is held by a non-array object end the chain as owners do."""
    while isinstance(getattr(a, "base", None), type(a)):
        a = a.base
    return a


def counter(a: Any) -> WriteVersion:
    """The write version of ``a``'s storage, made on first use."""
    root = storage(a)
    with _lock:
        entry = _versions.get(id(root))
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
            counter(a)._moved()


def continue_from(a: Any, previous: Any) -> None:
    """Make ``a``'s new storage count on from ``previous``'s (a tensor whose write gave it
    new memory keeps one history) and count the write."""
    with _lock:
        found = counter(previous)
        _register(storage(a), found)
        found._moved()


def mark_shared(a: Any) -> None:
    """Note that another library holds ``a``'s memory and may write it unseen: counted as
    a write now, and moved in every snapshot from now on."""
    with _lock:
        found = counter(a)
        found.shared = True
        found._moved()


class Snapshot:
    """The storages something derived from memory was made from, and which of them were
    written since it was last made."""

    __slots__ = ("versions", "moved", "__weakref__")

    def __init__(self) -> None:
        self.versions: list[WriteVersion] = []
        self.moved: set[int] = set()  # positions in ``versions``

    def track(self, version: WriteVersion) -> int:
        """Follow ``version`` too (once), read as moved until the next ``take``; its position."""
        with _lock:
            for position, known in enumerate(self.versions):
                if known is version:
                    break
            else:
                position = len(self.versions)
                self.versions.append(version)
                version.watchers.append((weakref.ref(self), position))
            self.moved.add(position)
        return position

    def stale(self) -> bool:
        """Whether a storage was written (or shared) since the last ``take``."""
        return bool(self.moved)

    def take(self) -> list[int]:
        """The positions of the storages written since the last take, forgotten now (a
        shared one stays moved).  Call it before deriving again, so a write landing
        meanwhile leaves the snapshot stale."""
        with _lock:
            moved = sorted(self.moved)
            self.moved = {p for p, v in enumerate(self.versions) if v.shared}
        return moved
