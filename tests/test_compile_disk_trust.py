"""The disk cache trusts only what this user's tensorcore wrote: plan files are signed
with a key kept outside the cache, the cache directory must be private to the user,
and a plan path that is not a regular file is skipped without blocking."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import layers
import tensorcore as tc
from tensorcore.compile import disk

pytestmark = pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX file ownership and modes")


def _model() -> layers.Module:
    tc.manual_seed(0)
    return layers.Sequential(layers.Linear(4, 3), layers.ReLU())


def _x() -> tc.Tensor:
    return tc.tensor(np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4))


def _run(model: layers.Module, cache_dir: Path) -> tuple[np.ndarray, tc.compile.CacheInfo]:
    compiled = tc.compile(model, cache_dir=cache_dir)
    with tc.no_grad():
        got, want = compiled(_x()).numpy(), model(_x()).numpy()
    np.testing.assert_array_equal(got, want)
    return got, compiled.cache_info()


def test_a_planted_plan_with_a_recomputed_checksum_is_ignored(tmp_path):
    model = _model()
    _run(model, tmp_path)
    path, = tmp_path.rglob("*.json")
    document = json.loads(path.read_bytes())
    text = json.dumps(document["body"]).replace('"relu"', '"none"')  # drop the activation
    assert text != json.dumps(document["body"])
    body = json.loads(text)
    digest = hashlib.sha256(disk.canonical(body)).hexdigest()  # what a forger can compute
    path.write_bytes(disk.canonical({"mac": digest, "body": body}))
    got, info = _run(model, tmp_path)  # the forged plan would return negative values
    assert info.disk_loads == 0 and info.traces == 1 and (got >= 0).all()
    assert json.loads(path.read_bytes())["mac"] != digest  # rewritten by the trace


def _assert_cache_refused(cache_dir: Path, reason: str) -> None:
    with pytest.warns(disk.UnsafeCacheWarning, match=reason):
        _, info = _run(_model(), cache_dir)
    assert info.traces == 1 and not list(cache_dir.rglob("*.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", disk.UnsafeCacheWarning)  # one warning per directory
        _run(_model(), cache_dir)


def test_a_group_writable_cache_dir_is_not_used(tmp_path):
    cache_dir = tmp_path / "shared"
    cache_dir.mkdir()
    cache_dir.chmod(0o775)
    _assert_cache_refused(cache_dir, "writable by group or others")


@pytest.mark.skipif(hasattr(os, "getuid") and os.getuid() != 0, reason="changing a directory's owner needs root")
def test_a_cache_dir_of_another_user_is_not_used(tmp_path):
    cache_dir = tmp_path / "theirs"
    cache_dir.mkdir(mode=0o755)
    os.chown(cache_dir, 65534, 65534)
    _assert_cache_refused(cache_dir, "owned by user 65534")


def test_a_signing_key_others_can_read_turns_the_cache_off(tmp_path, monkeypatch):
    key = tmp_path / "config" / "cache.key"
    key.parent.mkdir()
    key.write_bytes(os.urandom(32))
    key.chmod(0o644)
    monkeypatch.setenv("TENSORCORE_CACHE_KEY_FILE", str(key))
    _assert_cache_refused(tmp_path / "cache", "mode 0600")


def test_new_cache_directories_are_private(tmp_path):
    previous = os.umask(0o002)  # a umask that would make group-writable directories
    try:
        _run(_model(), tmp_path / "new")
    finally:
        os.umask(previous)
    path, = (tmp_path / "new").rglob("*.json")
    directory = path.parent
    while directory != tmp_path:
        assert disk.unsafe_reason(directory) is None
        directory = directory.parent


def test_a_fifo_at_the_plan_path_does_not_block_the_call(tmp_path):
    model = _model()
    _run(model, tmp_path)
    path, = tmp_path.rglob("*.json")
    path.unlink()
    os.mkfifo(path)
    done: list = []
    worker = threading.Thread(target=lambda: done.append(_run(model, tmp_path)[1]), daemon=True)
    worker.start()
    worker.join(timeout=30)
    if worker.is_alive():  # unblock the reader so the process can exit, then fail
        with open(path, "wb"):
            pass
        pytest.fail("the call blocked opening a FIFO planted at its plan path")
    assert done and done[0].traces == 1 and path.is_file()  # skipped, then replaced by a plan
