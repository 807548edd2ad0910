"""Running an op's NumPy reference while another process compiles its Numba kernel.

On a cold kernel cache a model's first step would wait for every kernel it calls to
compile, about a second apiece.  While ``warmup.BackgroundCompiles`` runs other
processes that compile them, the run need not wait: a backend call whose
kernel is not compiled yet runs the NumPy backend's version of the op instead, and
the kernel is handed to a compiling process.  A later call loads it from the disk
cache once it is there.

* Each Numba backend method is served through ``deferrable``: inside it, a kernel
  compile that the active ``compiler`` takes over raises ``KernelPending`` where the
  compile would start (before any output is written: every kernel is compiled before
  it runs), and the method's NumPy reference answers the call.
* Compiles outside such a call (a compiled plan's bound steps, a kernel called
  directly) are made in place, as always.

Results: until its kernels load, a run computes with NumPy's reference ops, which
round differently in the last bits; a cold run's first steps are therefore not bit
for bit those of a warm run (every later step uses the same kernels).
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Callable, Protocol

from ..numpy.backend import NumpyBackend


class KernelPending(Exception):
    """A kernel another process is compiling: its caller runs the reference instead."""


class Compiler(Protocol):
    """What compiles kernels elsewhere (``warmup.BackgroundCompiles``)."""

    def pending(self) -> bool: ...


compiler: Compiler | None = None  # set while other processes take over kernel compiles

_calls = threading.local()  # .depth: deferrable backend calls running in this thread


def deferrable(name: str, method: Callable) -> Callable:
    """``method`` (a Numba kernel group's function serving protocol method ``name``),
    answered by NumpyBackend's ``name`` when one of its kernels is pending.  An
    ``out=`` that only the Numba method takes (arrays, or a tuple with None for
    "allocate") receives the reference's result."""
    reference = getattr(NumpyBackend, name)
    reference_takes_out = "out" in inspect.signature(inspect.unwrap(reference)).parameters

    def run_reference(self: Any, args: tuple, kwargs: dict) -> Any:
        out = None if reference_takes_out else kwargs.pop("out", None)
        result = reference(self, *args, **kwargs)
        return result if out is None else _written(out, result)

    @functools.wraps(method)
    def serve(self: Any, *args: Any, **kwargs: Any) -> Any:
        if compiler is None:
            return method(self, *args, **kwargs)
        depth = getattr(_calls, "depth", 0)
        _calls.depth = depth + 1
        try:
            return method(self, *args, **kwargs)
        except KernelPending:
            return run_reference(self, args, kwargs)
        finally:
            _calls.depth = depth

    return serve


def _written(out: Any, result: Any) -> Any:
    """``result`` copied into the caller's ``out`` (an array, or a tuple of arrays and
    Nones), returned as the method would have returned it."""
    if isinstance(out, tuple):
        return tuple(r if o is None else _written(o, r) for o, r in zip(out, result))
    out[...] = result
    return out


def in_deferrable_call() -> bool:
    """Whether this thread is inside a ``deferrable`` backend call (a pending kernel
    may then raise ``KernelPending``)."""
    return getattr(_calls, "depth", 0) > 0


def pending() -> bool:
    """Whether kernels are still compiling elsewhere (some calls run the reference)."""
    return compiler is not None and compiler.pending()
