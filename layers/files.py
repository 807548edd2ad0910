"""Reading files that come from elsewhere: regular files only, bounded sizes, paths kept inside their folder.

A model folder may come from a stranger.  Its files are opened only when, after every
symbolic link is followed, they are regular files (a link to ``/dev/zero``, a FIFO or a
directory is refused, and a FIFO is never opened blocking); JSON files are read up to a
size cap and a nesting depth; a path a folder names for itself must stay inside it.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, BinaryIO

JSON_LIMIT = 16 << 20  # bytes; diffusers/transformers configs and indexes are a few kB, tokenizer files a few MB
JSON_DEPTH = 64  # nesting levels; their configs nest at most four deep

_KINDS = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device",
          stat.S_ISBLK: "a block device", stat.S_ISSOCK: "a socket"}


def _refuse_irregular(mode: int, what: str, path: str, real: str) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS.items() if test(mode)), "not a regular file")
        raise ValueError(f"{what}: {path!r} is not a regular file (it resolves to {real!r}, {kind})")


def open_regular(path: str | os.PathLike, what: str) -> BinaryIO:
    """``path`` opened for binary reading when it resolves to a regular file, else a ValueError
    naming ``what`` and the path (FileNotFoundError when nothing is there).

    The kind is checked before opening (a device is never opened) and again on the open
    descriptor (a swap in between is caught); the open is non-blocking, so a FIFO cannot hang.
    """
    path = os.fspath(path)
    real = os.path.realpath(path)
    _refuse_irregular(os.stat(real).st_mode, what, path, real)
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _refuse_irregular(os.fstat(fd).st_mode, what, path, real)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_bounded(path: str | os.PathLike, what: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``; a ValueError when it holds more than ``limit``."""
    with open_regular(path, what) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{what}: {os.fspath(path)!r} is larger than the {limit:,} bytes read from such a file")
    return data


def read_json(path: str | os.PathLike, what: str, limit: int = JSON_LIMIT) -> Any:
    """The JSON value in the regular file ``path``, at most ``limit`` bytes and ``JSON_DEPTH``
    levels deep; anything else raises ValueError naming ``what`` and the path."""
    data = read_bounded(path, what, limit)
    try:
        value = json.loads(data)
    except RecursionError:
        value = None  # deeper than the interpreter's stack: reported below as too deep
        depth = JSON_DEPTH + 1
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what}: {os.fspath(path)!r} is not valid JSON ({exc})") from exc
    else:
        depth = _depth(value)
    if depth > JSON_DEPTH:
        raise ValueError(f"{what}: {os.fspath(path)!r} nests deeper than {JSON_DEPTH} levels")
    return value


def _depth(value: Any) -> int:
    """How deep lists and objects nest in ``value`` (walked without recursion, stopping past ``JSON_DEPTH``)."""
    depth, level = 0, [value]
    while depth <= JSON_DEPTH:
        level = [v for item in level if isinstance(item, list | dict)
                 for v in (item.values() if isinstance(item, dict) else item)]
        if not level:
            return depth
        depth += 1
    return depth


def inside(root: str | os.PathLike, relative: Any, what: str) -> str:
    """``root/relative`` with links resolved, when it stays inside ``root`` (itself resolved);
    a ValueError naming ``what`` and the entry for anything else, absolute paths included."""
    if not isinstance(relative, str) or not relative or os.path.isabs(relative) or "\0" in relative:
        raise ValueError(f"{what}: {relative!r} must be a relative path inside {os.fspath(root)!r}")
    base = os.path.realpath(root)
    real = os.path.realpath(os.path.join(base, relative))
    if os.path.commonpath([base, real]) != base:
        raise ValueError(f"{what}: {relative!r} leads outside {os.fspath(root)!r} (to {real!r})")
    return real
