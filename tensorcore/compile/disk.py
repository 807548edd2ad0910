"""The disk cache of lowered plans.

``DiskCache`` keeps plans under ``<cache dir>/compile/<model identity>/<key>.json``
(``TENSORCORE_CACHE_DIR``, default ``~/.cache/tensorcore``).  A file is JSON holding the
encoded plan (``encoding``) with an HMAC of it under the user's own key (``signing``);
nothing in it is executed.  A file that is truncated, corrupted, stale, unsigned or
signed with another key, or not a regular file, is ignored, logged once, and rewritten
by the next trace.  The cache directory must belong to the current user and be
writable by nobody else; otherwise the disk cache is not used at all (one warning).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import threading
import warnings
from pathlib import Path
from typing import Any

from .. import __version__, backends, settings
from ..atomic import write_atomic
from . import signing
from .encoding import FORMAT, NotEncodable, decode, encode, need
from .identity import sources_digest
from .plan import Plan

log = logging.getLogger("tensorcore.compile")

MAX_FILE_BYTES = 256 << 20


class UnsafeCacheWarning(UserWarning):
    """The disk cache is not used: its directory or the signing key cannot be trusted."""


_reported: set[str] = set()
_report_lock = threading.Lock()


def _first_time(what: str) -> bool:
    """Whether ``what`` is reported for the first time in this process."""
    with _report_lock:
        if what in _reported:
            return False
        _reported.add(what)
        return True


def _report(path: Path, problem: str) -> None:
    """Log a problem with a cache file once per process."""
    if _first_time(str(path)):
        log.warning("compile: ignoring the cached plan %s (%s); it will be rewritten", path, problem)


def canonical(data: Any) -> bytes:
    """The one byte form of a JSON document that is signed and written."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def unsafe_reason(directory: Path) -> str | None:
    """Why an existing ``directory`` cannot hold trusted plans, or None: it must be a
    directory owned by this user that neither group nor others may write."""
    try:
        info = os.stat(directory)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        return f"{directory} is not a directory"
    if not hasattr(os, "getuid"):  # no POSIX owners and modes (Windows): its ACLs are left to the user
        return None
    if info.st_uid != os.getuid():
        return f"{directory} is owned by user {info.st_uid}, not by this user ({os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{directory} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


class DiskCache:
    """Plans on disk, one signed JSON file per (model identity, key)."""

    def __init__(self, root: Path) -> None:
        self.root = root  # <cache dir>/compile
        self.usable = True
        self._trusted = False  # both directories exist and were found safe

    @classmethod
    def open(cls, cache_dir: Any) -> "DiskCache | None":
        """``cache_dir``: None for the default (``TENSORCORE_CACHE_DIR``), False for none."""
        if cache_dir is False:
            return None
        if cache_dir is None:
            cache_dir = settings.cache_dir()
        if not isinstance(cache_dir, str | os.PathLike):
            raise TypeError(f"compile: cache_dir must be a path, None or False, got {cache_dir!r}")
        return cls(Path(cache_dir) / "compile")

    def path(self, stable: Any, model: str) -> Path:
        name = hashlib.sha256(repr(stable).encode()).hexdigest()[:40]
        return self.root / model[:40] / f"{name}.json"

    def _check(self) -> bool:
        """Whether the cache may be read and written; the first failure turns it off for
        good with one warning."""
        if self._trusted or not self.usable:
            return self.usable
        try:
            reason = unsafe_reason(self.root.parent) or unsafe_reason(self.root)
            signing.signing_key()
        except OSError as exc:
            reason = str(exc)
        if reason is not None:
            self.usable = False
            if _first_time(f"unsafe:{self.root}"):
                warnings.warn(f"tc.compile: not using the disk cache in {self.root.parent}: {reason}",
                              UnsafeCacheWarning, stacklevel=4)
            return False
        self._trusted = self.root.is_dir()
        return True

    def load(self, stable: Any, model: str, named: list, backend: Any, inputs: list[Any]
             ) -> tuple[Plan, dict[int, Any]] | None:
        if not self._check():
            return None
        path = self.path(stable, model)
        raw = _read_regular(path)
        if raw is None:
            return None
        try:
            need(len(raw) <= MAX_FILE_BYTES, "file too large")
            document = json.loads(raw)
            need(type(document) is dict and set(document) == {"mac", "body"}, "not a plan file")
            body = document["body"]
            need(signing.verify(canonical(body), document["mac"]),
                 "signature mismatch: not written by this user's tensorcore")
            need(type(body) is dict and body.get("format") == FORMAT, "other format")
            need(body.get("tensorcore") == __version__ and body.get("sources") == sources_digest(),
                 "stale: made by another version of tensorcore or its kernels")
            need(body.get("model") == model and body.get("key") == repr(stable), "made for another model or key")
            return decode(body.get("plan"), named, backend, inputs)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            _report(path, str(exc) or type(exc).__name__)
            return None

    def save(self, stable: Any, model: str, plan: Plan, named: list) -> None:
        """Write the plan atomically; plans without a plain-data form are skipped."""
        if not self._check():
            return
        backend = backends.load(plan.graph.backend)
        try:
            body = {"format": FORMAT, "tensorcore": __version__, "sources": sources_digest(), "model": model,
                    "key": repr(stable), "plan": encode(plan, type(backend).to_numpy.__get__(backend))}
            payload = canonical({"mac": signing.sign(canonical(body)), "body": body})
        except (NotEncodable, ValueError) as exc:
            log.debug("compile: plan kept in memory only (%s)", exc)
            return
        path = self.path(stable, model)
        try:
            _make_private_dirs(path.parent, self.root.parent)
            if not self._check():  # the directories just made, or found made meanwhile
                return
            write_atomic(path, payload)
        except OSError as exc:
            _report(path, f"cannot write: {exc}")


def _make_private_dirs(directory: Path, top: Path) -> None:
    """Make ``directory`` and its parents up to ``top`` with mode 0700 where missing
    (whatever the umask, as they hold what the disk cache trusts)."""
    top.parent.mkdir(parents=True, exist_ok=True)
    for d in reversed([directory, *directory.parents]):
        if d == top or top in d.parents:
            d.mkdir(mode=0o700, exist_ok=True)


def _read_regular(path: Path) -> bytes | None:
    """The bytes of the plan file at ``path`` (at most one past the size limit), or None
    when there is none or it is not a regular file: opened without blocking, so a FIFO
    planted there cannot stall the call, and without following a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        _report(path, f"unreadable: {exc}")
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            _report(path, "not a regular file")
            return None
        try:
            return f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            _report(path, f"unreadable: {exc}")
            return None
