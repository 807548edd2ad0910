"""glibc's malloc kept from handing every large array fresh pages.

A CPU train step allocates and frees arrays of a few hundred KB to a few MB every few
tens of microseconds.  By default glibc serves an allocation above its mmap threshold
(128 KB, raised at run time to the largest block freed so far) with fresh pages from
the kernel, and returns the top of its heap to the kernel whenever more than twice
that threshold is free there.  Either way the next array of that size is new memory,
and the kernel that writes it takes a page fault per 4 KB page: for a ReLU over
512 KB, several times the kernel's own work.

``configure`` (called once when the Numba backend is created) raises both limits for
the process, much as jemalloc and tcmalloc behave by default: blocks up to
``MMAP_THRESHOLD`` come from the heap, and up to ``TRIM_THRESHOLD`` of free heap top
stays mapped for the next arrays.  It does nothing where the C library is not glibc,
or where the environment already sets glibc's malloc options (``MALLOC_*_`` variables
or ``glibc.malloc`` tunables): those then stand.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit systems
TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)

_lock = threading.Lock()
_applied: bool | None = None


def configure() -> bool:
    """Set glibc's mmap and trim thresholds once per process (idempotent); True when
    they are set, False when left alone (not glibc, or set by the environment)."""
    global _applied
    with _lock:
        if _applied is None:
            _applied = _set_thresholds()
        return _applied


def _user_settings() -> bool:
    """True when the environment sets any of glibc's malloc options."""
    return (any(name.startswith("MALLOC_") and name.endswith("_") for name in os.environ)
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""))


def _set_thresholds() -> bool:
    if platform.libc_ver()[0] != "glibc" or _user_settings():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # the mmap threshold first: setting either one fixes both (no more run-time raises)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
