"""Atomic, durable file writes, shared by every save in the project.

The bytes go to a temporary file beside the target, named after it
(``.NAME.<pid>.<random>.tmp``), which is flushed to disk and renamed over the target,
and the rename itself is flushed by syncing the directory: a reader sees the old file
or the whole new one, never a partial write.  A process killed mid-save cannot remove
its temporary file, so each save first removes the temporaries of that target whose
writing process is gone.

A new file gets the mode the umask gives (as ``open()`` would); an overwritten regular
file keeps its mode.  A symbolic link at the target is replaced by a regular file with
the umask's mode: the link's target (``/dev/null``, say) is neither written nor its mode
copied.
"""

from __future__ import annotations

import os
import re
import secrets
import stat


def write_atomic(path: str | os.PathLike, payload: bytes) -> None:
    """Write ``payload`` to ``path`` through a synced temporary file renamed over it."""
    path = os.path.abspath(os.fspath(path))
    directory, name = os.path.split(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"save: cannot write {path!r}: the directory {directory!r} does not exist")
    remove_stale_temporaries(path)
    fd, tmp = _create_temporary(directory, name)
    try:
        with os.fdopen(fd, "wb") as f:
            _keep_mode(f.fileno(), path)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _sync_directory(directory)


def _create_temporary(directory: str, name: str) -> tuple[int, str]:
    """A new file ``.NAME.<pid>.<random>.tmp`` beside the target, created with mode
    0o666 so the umask applies as it would to the target itself."""
    while True:
        tmp = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue


def _keep_mode(fd: int, path: str) -> None:
    """Give the temporary file the mode of the regular file it will replace, if there is one
    (a link is not followed: the rename replaces the link itself)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(info.st_mode) and hasattr(os, "fchmod"):
        os.fchmod(fd, stat.S_IMODE(info.st_mode))


def _sync_directory(directory: str) -> None:
    """Flush the directory entry of the rename to disk (POSIX; a no-op elsewhere)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temporaries(path: str | os.PathLike) -> list[str]:
    """Delete the temporary files of saves of ``path`` whose process no longer runs.

    Returns the removed paths.  Temporaries of running processes (a save in progress,
    in this process or another) are left alone.
    """
    path = os.path.abspath(os.fspath(path))
    directory, name = os.path.split(path)
    pattern = re.compile(rf"\.{re.escape(name)}\.(\d+)\.[0-9a-f]+\.tmp")
    removed = []
    for entry in os.listdir(directory):
        match = pattern.fullmatch(entry)
        if match is None or _process_alive(int(match.group(1))):
            continue
        stale = os.path.join(directory, entry)
        try:
            os.unlink(stale)
        except FileNotFoundError:  # another save removed it first
            continue
        removed.append(stale)
    return removed


def _process_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` exists (signal 0 checks without signalling)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but belongs to another user (EPERM), or we cannot tell
        return True
    return True
