"""The key that signs the disk cache's plan files (HMAC-SHA256).

A checksum proves nothing about a plan file: whoever can write the file can recompute
it.  So a file carries an HMAC of its body under a 32-byte random key that lives with
the user's own settings, not in the cache (``settings.cache_key_file()``: by default
``$XDG_CONFIG_HOME/tensorcore/cache.key`` or ``~/.config/tensorcore/cache.key``),
created with mode 0600 on first use.  A key file that is not a regular 32-byte file
owned by the user and private to them is refused (``SigningKeyError``), and the disk
cache is then not used.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import threading
from pathlib import Path

from .. import settings

KEY_BYTES = 32

_keys: dict[str, bytes] = {}  # key file path -> its key, read once per process
_lock = threading.Lock()


class SigningKeyError(OSError):
    """The key file cannot be trusted or made."""


def sign(data: bytes) -> str:
    """The HMAC-SHA256 of ``data`` under the user's key, as hex."""
    return hmac.new(signing_key(), data, hashlib.sha256).hexdigest()


def verify(data: bytes, mac: object) -> bool:
    """Whether ``mac`` is the HMAC of ``data`` under the user's key (constant-time)."""
    return isinstance(mac, str) and hmac.compare_digest(sign(data), mac)


def signing_key() -> bytes:
    """The user's key: read from its file, made first when there is none (raises OSError)."""
    path = settings.cache_key_file()
    with _lock:
        key = _keys.get(path)
        if key is None:
            key = _keys[path] = _read_or_create(Path(path))
    return key


def _read_or_create(path: Path) -> bytes:
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(KEY_BYTES))
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)  # creates the key only if no other process made one meanwhile
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    return _read(path)


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size != KEY_BYTES:
            raise SigningKeyError(f"compile: the cache key {path} is not a regular file of {KEY_BYTES} bytes")
        if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & 0o077):
            raise SigningKeyError(f"compile: the cache key {path} must be owned by this user with mode 0600 "
                                  f"(owner {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})")
        return f.read()
