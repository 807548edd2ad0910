"""Numba's on-disk cache of the kernels, keyed by a fingerprint of every source they inline.

Numba checks a cached kernel against its own source file only.  A kernel that inlines a
helper from another file (``mathfn.fexp`` into softmax, ``act_value`` into every
epilogue, the op codes of ``backends/opcodes.py`` read as constants) would keep its old
machine code after that helper changed.  ``fingerprint()`` hashes every source the
kernels may inline (``kernels/*.py`` and ``backends/opcodes.py``), and:

* ``refresh()``, run when the kernels package is first imported, compares it with the
  stamp file kept in the directory where Numba caches the kernels (``__pycache__``
  beside the sources, or where ``NUMBA_CACHE_DIR`` or Numba's user-wide cache puts
  them); where they differ, the cached kernels (``*.nbi`` index and ``*.nbc`` code
  files) are deleted before anything loads them, and the stamp is rewritten.  They are
  compiled again on first use.
* the generated fused kernels (``numba/fused.py``) live in a directory named after the
  fingerprint under ``TENSORCORE_CACHE_DIR`` (``fused_dir()``), shared by every checkout
  and process with the same sources: a different version of the helpers finds its own.

A cold cache makes the first calls slow: each kernel compiles on first use, about a
second apiece, 30-60 s before a model's first training step on 2 cores (unless other
processes compile them meanwhile: ``warmup.BackgroundCompiles``).  ``announce_compiles``
(set up with the Numba backend) says so once, on stderr, when the first compile starts
(``notice``: which of the two notices); a warm cache loads every kernel without
compiling and prints nothing.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import sys
import threading
from pathlib import Path

from ... import settings
from ...atomic import write_atomic

KERNELS_DIR = Path(__file__).with_name("kernels")
KERNELS_PACKAGE = __package__ + ".kernels"
OPCODES = Path(__file__).parent.parent / "opcodes.py"
STAMP = "tensorcore-kernels.fingerprint"
COMPILE_NOTICE = ("tensorcore: compiling CPU kernels, once (about a second each; a model's first training step "
                  "may take 20-40 s); later runs load them from the cache")

DEFERRED_NOTICE = ("tensorcore: compiling CPU kernels in other processes, once (about a second each); the "
                   "first training steps run slower NumPy kernels meanwhile; later runs load them from the cache")
notice = COMPILE_NOTICE  # what the first compile prints (``warmup.BackgroundCompiles`` sets DEFERRED_NOTICE)

log = logging.getLogger("tensorcore.backends")


def sources() -> list[Path]:
    """Every source the cached kernels may inline, in a fixed order."""
    return sorted(KERNELS_DIR.glob("*.py")) + [OPCODES]


@functools.lru_cache(maxsize=None)
def fingerprint() -> str:
    """The SHA-256 of those sources' names and contents (read once per process)."""
    digest = hashlib.sha256()
    for path in sources():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def fused_dir() -> Path:
    """Where the generated fused kernels' sources, and so Numba's cache of them, go."""
    return Path(settings.cache_dir()) / "kernels" / "numba" / fingerprint()[:16]


def cache_dirs() -> list[Path]:
    """The directory Numba keeps the kernels' cache files in, as a list (empty when no
    cache can be written)."""
    directory = _numba_cache_dir(KERNELS_DIR / "jit.py")
    return [] if directory is None else [directory]


def _numba_cache_dir(source: Path) -> Path | None:
    """The directory Numba caches the functions of ``source`` in (made if missing, as Numba
    does), found as Numba finds it: the first of its locators that can be used."""
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # _CacheImpl in older Numba
    for locator_class in impl._locator_classes:
        locator = locator_class.from_function(_numba_cache_dir, str(source))
        if locator is not None:
            return Path(locator.get_cache_path())
    return None


def refresh(dirs: list[Path] | None = None, current: str | None = None) -> list[Path]:
    """Delete the cached kernels of every directory whose stamp is not ``current`` (the
    sources' fingerprint), stamp it, and return the directories cleared."""
    current = fingerprint() if current is None else current
    cleared = []
    for directory in cache_dirs() if dirs is None else dirs:
        stamp = directory / STAMP
        try:
            if not directory.is_dir() or (stamp.is_file() and stamp.read_text() == current):
                continue
            for cached in [*directory.glob("*.nbi"), *directory.glob("*.nbc")]:
                cached.unlink(missing_ok=True)
            write_atomic(stamp, current.encode())
            cleared.append(directory)
        except OSError as exc:  # a read-only cache: Numba will not write there either
            log.debug("numba kernel cache %s left as it is (%s)", directory, exc)
    return cleared


def is_tensorcore_kernel(dispatcher: object) -> bool:
    """Whether a Numba dispatcher compiles one of tensorcore's kernels (``kernels/`` and the
    generated fused ones), not a function of Numba's own or of another library."""
    return dispatcher.py_func.__module__.startswith("tensorcore")


_announcer_lock = threading.Lock()
_announcer = None  # the Numba event listener, once registered


def announce_compiles() -> None:
    """Print ``notice`` to stderr when Numba first compiles one of tensorcore's
    kernels (``kernels/`` and the generated fused ones) in this process (idempotent)."""
    global _announcer
    with _announcer_lock:
        if _announcer is not None:
            return
        from numba.core import event

        class CompileNotice(event.Listener):
            """Prints the notice at the start of the first compile of a tensorcore kernel."""

            announced = False

            def on_start(self, ev: event.Event) -> None:
                if not self.announced and is_tensorcore_kernel(ev.data["dispatcher"]):
                    self.announced = True
                    print(notice, file=sys.stderr, flush=True)

            def on_end(self, ev: event.Event) -> None:
                pass

        _announcer = CompileNotice()
        event.register("numba:compile", _announcer)
