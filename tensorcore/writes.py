"""A process-wide count of writes into existing device memory.

Backends whose results can be kept derived from memory (the CuPy backend: a CUDA-graph
plan's packed convolution weights) call ``note_write`` from every method that writes
into memory it was handed -- the in-place methods and those given ``out=`` -- and a
compiled replay calls it when its plan writes its arguments or its modules' state.
Whatever was derived from memory is made again once ``writes()`` has moved since --
unless the one write since is known to leave it alone (``note_write_after``).  Writes
into memory nothing is derived from (a plan's input buffers, an optimizer's lr scalars)
go through ``unnoted`` methods and are not counted.
Memory written past the backend (an array's own ``__setitem__``, another library
through DLPack) is not seen: see docs/compile.md.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
from typing import Any, Callable

_numbers = itertools.count(1)
_last = 0
_lock = threading.Lock()  # a write's number and the one before it, read as a pair


def note_write() -> None:
    """Mark a write: ``writes()`` moves to a number it never had."""
    global _last
    with _lock:
        _last = next(_numbers)


def note_write_after(seen: int | None) -> int | None:
    """Mark a write that leaves alone what its writer derived when ``writes()`` was
    ``seen`` (a compiled training step writes its parameters, never the frozen weights
    its plan keeps packed): the write's number when it directly follows ``seen`` -- what
    was derived then is still current as of it --, else None (another write came in
    between)."""
    global _last
    with _lock:
        before, _last = _last, next(_numbers)
        return _last if before == seen and seen is not None else None


def writes() -> int:
    """The number of the latest write (0 before any)."""
    return _last


def noting_writes(cls: type) -> type:
    """Make every public method of the backend class ``cls`` that writes into memory it
    was handed note the write: names ending in "_" (``copy_``, ``add_``, ``setitem_``,
    the optimizer updates) always, methods with an ``out`` parameter when given one."""
    for name in dir(cls):
        method = getattr(cls, name)
        if name.startswith("_") or not inspect.isfunction(method):
            continue
        parameters = list(inspect.signature(method).parameters)
        if name.endswith("_"):
            setattr(cls, name, _always(method))
        elif "out" in parameters:
            setattr(cls, name, _with_out(method, parameters.index("out")))
    return cls


def _always(method: Callable) -> Callable:
    @functools.wraps(method)
    def writing(*args: Any, **kwargs: Any) -> Any:
        note_write()
        return method(*args, **kwargs)
    writing.notes_writes = True  # type: ignore[attr-defined]
    return writing


def _with_out(method: Callable, position: int) -> Callable:
    @functools.wraps(method)
    def writing(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("out") is not None or (len(args) > position and args[position] is not None):
            note_write()
        return method(*args, **kwargs)
    writing.notes_writes = True  # type: ignore[attr-defined]
    return writing


def unnoted(method: Callable) -> Callable:
    """A bound backend method without its noting of writes, for writes into memory
    nothing is derived from: a compiled plan's own input buffers, an optimizer's
    learning rate, a schedule's step counter.  A method that notes no writes (another
    backend's, a trace's recorder, which must still see the call) is returned as is."""
    function = getattr(method, "__func__", None)
    if function is None or not getattr(function, "notes_writes", False):
        return method
    return function.__wrapped__.__get__(method.__self__)
