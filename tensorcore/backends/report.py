"""``DEBUG=2``: every backend call printed with what ran.

One line per protocol-method call, when it returns:

    [tensorcore] NumbaBackend.conv2d -> NumbaSpatialKernels.conv2d  kernels: winograd_input, ...

the backend class, the method, the function the backend's table serves it with
(``backends/dispatch.py``) and the kernels that ran inside it: the ``@njit`` kernels on
Numba (``numba/threads.SizedKernel``), the CUDA kernels and cuBLAS GEMMs on CuPy
(``cupy/loader.kernel``, ``cupy/conv_igemm``, ``cupy/cublas``).  The NumPy reference
launches no kernels of its own; its line names the serving function.  A call a backend
method makes to another of its methods is printed too, indented, before its caller.

The registry creates a backend as ``reporting(cls)()`` when the debug level is 2 or
more at creation (``settings.debug_level``), so calls cost nothing extra otherwise; the
kernel launchers check ``active`` (one attribute read) before noting a name.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from .dispatch import implementation, protocol_methods

active = False  # True once a reporting backend exists: the launchers note kernel names
_calls = threading.local()  # .open: the kernel names of each call in progress, innermost last


def note_kernel(name: str) -> None:
    """Record that kernel ``name`` ran, for the innermost backend call in progress."""
    open_calls = getattr(_calls, "open", None)
    if open_calls:
        open_calls[-1].append(name)


def reporting(cls: type) -> type:
    """A subclass of the backend class ``cls``, of the same name, whose protocol methods
    print a line each (see the module doc)."""
    global active
    active = True
    methods = {name: _reporter(cls.__name__, name, getattr(cls, name)) for name in protocol_methods()}
    return type(cls.__name__, (cls,), {**methods, "__module__": cls.__module__, "__doc__": cls.__doc__})


def _reporter(class_name: str, name: str, method: Callable) -> Callable:
    served = implementation(method)

    @functools.wraps(method)
    def report(self: Any, *args: Any, **kwargs: Any) -> Any:
        open_calls = _calls.__dict__.setdefault("open", [])
        open_calls.append([])
        try:
            return method(self, *args, **kwargs)
        finally:
            kernels = open_calls.pop()
            ran = f"  kernels: {', '.join(kernels)}" if kernels else ""
            print(f"[tensorcore] {'  ' * len(open_calls)}{class_name}.{name} -> {served}{ran}")
    return report
