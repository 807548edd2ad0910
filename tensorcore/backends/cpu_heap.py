"""Keep freed memory in the process heap, so large CPU arrays are not page-faulted anew.

glibc's ``malloc`` serves blocks above its mmap threshold with fresh ``mmap`` pages and
returns the top of the heap to the system once more than its trim threshold is free.
A train step allocates and frees many arrays of a few MB, so with those defaults every
step faults their pages in again: on a 2-core VM a 3x3 convolution over
[16, 64, 32, 32] spent ~2.7 ms of its 11 ms in ~1500 page faults.  Raising both
thresholds lets freed blocks be reused warm.  The cost is memory: up to
``TRIM_THRESHOLD`` bytes of freed heap stay with the process.

Applies to glibc only, and not when the environment sets ``MALLOC_MMAP_THRESHOLD_``
or ``MALLOC_TRIM_THRESHOLD_`` (glibc's own tunables win).
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's upper limit on 64-bit systems
TRIM_THRESHOLD = 256 * 1024 * 1024


def retain_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds; True when they were set."""
    if not sys.platform.startswith("linux"):
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
