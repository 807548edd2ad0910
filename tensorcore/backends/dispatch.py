"""Which implementation serves each protocol method of a backend.

Every backend class states it in one place: a table (a dict, protocol method -> the
function that serves it) handed to the ``serving`` class decorator, plus the few methods
the class body defines itself.  ``serving`` checks that every method of the protocol
(``base.Backend``) is served exactly once -- by the table or by the class body, never
both -- and puts the table's functions on the class, so the order of the kernel groups
among the bases decides nothing.  The kernel groups (``NumbaNNKernels``, ``CupyLinalgKernels``,
...) stay bases only for their helper methods and for ``super()``, which in a kernel hands a
call it does not cover on to the parent backend's table entry (Numba and CuPy -> NumPy).

``python -m tensorcore.backends.dispatch numba`` prints a backend's whole table.
"""

from __future__ import annotations

import inspect
import sys
from typing import Callable

from .base import Backend


def protocol_methods() -> tuple[str, ...]:
    """The names of the methods every backend implements, in the protocol's order."""
    return tuple(name for name, value in vars(Backend).items()
                 if not name.startswith("_") and inspect.isfunction(value))


def serving(table: dict[str, Callable]) -> Callable[[type], type]:
    """A class decorator: the backend class serves each protocol method with the function
    ``table`` names for it, with the method its own body defines, or -- for a subclass of
    another backend -- as that parent backend does, each set on the class explicitly."""

    def serve(cls: type) -> type:
        methods = protocol_methods()
        parent = next((base for base in cls.__mro__[1:] if base in _SERVED), None)
        own = {name for name in methods if name in vars(cls)}
        inherited = set(methods) - own - table.keys() if parent is not None else set()
        both = own & table.keys()
        missing = set(methods) - own - table.keys() - inherited
        unknown = table.keys() - set(methods)
        if both or missing or unknown:
            raise TypeError(f"{cls.__name__}: protocol methods served twice {sorted(both)}, "
                            f"not served {sorted(missing)}, not in the protocol {sorted(unknown)}")
        for name in inherited:
            setattr(cls, name, vars(parent)[name])
        for name, function in table.items():
            setattr(cls, name, function)
        _SERVED.add(cls)
        return cls

    return serve


_SERVED: set[type] = set()  # the backend classes ``serving`` has set up


def is_served(cls: type) -> bool:
    """Whether ``serving`` set up the class ``cls`` (a backend class, not a kernel group)."""
    return cls in _SERVED


def implementation(function: Callable) -> str:
    """The readable name of what serves a method: ``NumbaSpatialKernels.conv2d``, or
    ``computes_in_float32(NumpyConvKernels.conv2d)`` for a bfloat16 policy wrapper (the
    ``DEBUG=2`` reporting wrapper is seen through)."""
    function = getattr(function, "__wrapped__", function)
    return function.__qualname__


def table(cls: type) -> dict[str, str]:
    """Protocol method -> the name of the function that serves it, for a backend class."""
    return {name: implementation(getattr(cls, name)) for name in protocol_methods()}


if __name__ == "__main__":
    from . import load

    backend = load(sys.argv[1] if len(sys.argv) > 1 else "numpy")
    for method, served in table(type(backend)).items():
        print(f"{method:32} {served}")
