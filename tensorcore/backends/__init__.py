"""Backend registry: which backend serves which device.

The CPU device is served by the NumPy or the Numba backend (``TENSORCORE_BACKEND``
or ``use_backend``); the ``cuda`` device by the CuPy backend.  Backends are created
on first use so importing tensorcore compiles nothing and imports no CuPy.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from typing import Iterator

from .. import settings
from . import report
from .base import Backend

_MODULES = {
    "numpy": ("tensorcore.backends.numpy.backend", "NumpyBackend"),
    "numba": ("tensorcore.backends.numba.backend", "NumbaBackend"),
    "cupy": ("tensorcore.backends.cupy.backend", "CupyBackend"),
}
_INSTALL_HINT = {
    "numba": "pip install numba",
    "cupy": ('pip install -e ".[cuda12]" (or ".[cuda13]") in a checkout, or pip install "tensorcore-engine[cuda12]" '
             '(or "[cuda13]"); CuPy needs a working NVIDIA GPU'),
}
_instances: dict[str, Backend] = {}


def load(name: str) -> Backend:
    """The backend object named ``name`` (created once), or a clear error.  With
    ``DEBUG=2`` it prints every call (``backends/report.py``)."""
    if name not in _MODULES:
        raise ValueError(f"unknown backend {name!r}; valid values: {', '.join(settings.VALID_BACKENDS)}")
    if name not in _instances:
        module_name, class_name = _MODULES[name]
        try:
            module = importlib.import_module(module_name)
            cls = getattr(module, class_name)
            backend = (report.reporting(cls) if settings.debug_level >= 2 else cls)()
        except ImportError as exc:
            raise RuntimeError(f"backend {name!r} is unavailable ({exc}); install it with: {_INSTALL_HINT.get(name, 'pip install tensorcore-engine')}") from exc
        _instances[name] = backend
    return _instances[name]


def _initial_cpu_backend() -> str:
    requested = settings.backend_name
    if requested is None:
        return "numba" if importlib.util.find_spec("numba") else "numpy"
    if requested not in _MODULES:
        raise ValueError(f"TENSORCORE_BACKEND={requested!r} is not a backend; valid values: {', '.join(settings.VALID_BACKENDS)}")
    return "numpy" if requested == "cupy" else requested


_cpu_name = _initial_cpu_backend()
default_device = "cuda" if settings.backend_name == "cupy" else "cpu"
if settings.backend_name is not None:
    load(settings.backend_name)  # an explicitly requested backend must work at import


def created(name: str) -> Backend | None:
    """The backend named ``name`` if it has been created, else None (creates nothing)."""
    return _instances.get(name)


def loaded() -> list[Backend]:
    """Every backend created so far."""
    return list(_instances.values())


def cpu_backend_name() -> str:
    """The name of the backend serving the "cpu" device now."""
    return _cpu_name


def backend_for(device: str) -> Backend:
    """The backend serving ``device`` ("cpu" or "cuda")."""
    if device == "cpu":
        return load(_cpu_name)
    if device == "cuda":
        return load("cupy")
    raise ValueError(f"unknown device {device!r}; valid devices: 'cpu', 'cuda'")


def get_backend() -> Backend:
    """The backend that serves the default device."""
    return backend_for(default_device)


def set_backend(name: str) -> Backend:
    """Make ``name`` the default backend from now on (and return it)."""
    global _cpu_name, default_device
    backend = load(name)
    if backend.device == "cpu":
        _cpu_name, default_device = name, "cpu"
    else:
        default_device = "cuda"
    return backend


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[Backend]:
    """Make ``name`` the default backend inside a ``with`` block (tests, comparisons)."""
    global _cpu_name, default_device
    saved = _cpu_name, default_device
    backend = set_backend(name)  # raises before anything changes for an unknown name
    try:
        yield backend
    finally:
        _cpu_name, default_device = saved


def default_device_name() -> str:
    """The device new tensors go to when none is given."""
    return default_device
