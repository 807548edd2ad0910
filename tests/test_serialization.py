"""Durable saves: temporaries named after their target, cleaned up after a killed save,
file modes as ``open()`` would give them, and errors that name the target."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from layers import serialization

REPO = Path(__file__).resolve().parents[1]
posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX processes and file modes")

# Saves the same 8 MB array over and over until it is killed.
_SAVE_FOREVER = """
import sys
import numpy as np
from layers import serialization
path, value = sys.argv[1], float(sys.argv[2])
arrays = {"w": np.full(2_000_000, value, np.float32)}
print("ready", flush=True)
while True:
    serialization.save_file(arrays, path)
"""


def _others(directory: Path, name: str) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != name)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _kill_mid_save(path: Path, value: float) -> tuple[int, list[str]]:
    """Start a process saving to ``path`` in a loop, SIGKILL it while a temporary file
    exists, and return its pid and the files it left beside the target."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen([sys.executable, "-c", _SAVE_FOREVER, str(path), str(value)], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while not _others(path.parent, path.name):
            assert time.monotonic() < deadline, "the saving process never created a temporary file"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return child.pid, _others(path.parent, path.name)


@posix_only
def test_a_save_killed_midway_leaves_the_old_file_and_the_next_save_removes_its_temporary(tmp_path):
    path = tmp_path / "model.safetensors"
    serialization.save_file({"w": np.full(2_000_000, -1.0, np.float32)}, path)
    left_behind = 0
    for round_ in range(3):
        pid, leftovers = _kill_mid_save(path, float(round_))
        for name in leftovers:
            assert re.fullmatch(rf"\.model\.safetensors\.{pid}\.[0-9a-f]+\.tmp", name), name
        left_behind += len(leftovers)
        values = np.unique(serialization.load_file(path)["w"])  # the target is always a whole file
        assert len(values) == 1 and values[0] in (-1.0, 100.0 + round_ - 1, float(round_))
        serialization.save_file({"w": np.full(2_000_000, 100.0 + round_, np.float32)}, path)
        assert _others(tmp_path, path.name) == []
        assert np.all(serialization.load_file(path)["w"] == 100.0 + round_)
    assert left_behind > 0, "no save was killed while writing its temporary file"


@posix_only
def test_only_temporaries_of_finished_processes_are_removed(tmp_path):
    path = tmp_path / "model.safetensors"
    dead, alive = _dead_pid(), os.getppid()
    names = {
        f".model.safetensors.{dead}.0a1b2c3d.tmp": False,      # its process is gone: removed
        f".model.safetensors.{alive}.0a1b2c3d.tmp": True,      # a save still running elsewhere
        f".model.safetensors.{os.getpid()}.0a1b2c3d.tmp": True,  # a save in another thread here
        f".other.safetensors.{dead}.0a1b2c3d.tmp": True,       # another target's temporary
        f".model.safetensors.{dead}.notes.txt": True,          # not a temporary name
    }
    for name in names:
        (tmp_path / name).write_bytes(b"partial")
    serialization.save_file({"w": np.zeros(3, np.float32)}, path)
    kept = set(_others(tmp_path, path.name))
    assert kept == {name for name, keep in names.items() if keep}


@posix_only
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_the_mode_of_the_umask(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        serialization.save_file({"w": np.zeros(3, np.float32)}, tmp_path / "m.safetensors")
    finally:
        os.umask(previous)
    assert (tmp_path / "m.safetensors").stat().st_mode & 0o777 == mode


def _save_ones_under_umask(path, umask: int) -> None:
    """Save ``{"w": ones(3)}`` to ``path`` with ``umask`` in force."""
    previous = os.umask(umask)
    try:
        serialization.save_file({"w": np.ones(3, np.float32)}, path)
    finally:
        os.umask(previous)


@posix_only
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o600])
def test_an_overwritten_file_keeps_its_mode(tmp_path, mode):
    path = tmp_path / "m.safetensors"
    serialization.save_file({"w": np.zeros(3, np.float32)}, path)
    path.chmod(mode)
    _save_ones_under_umask(path, 0o077)
    assert path.stat().st_mode & 0o777 == mode
    assert np.all(serialization.load_file(path)["w"] == 1)


def test_saving_into_a_missing_directory_names_the_target(tmp_path):
    path = tmp_path / "missing" / "m.safetensors"
    with pytest.raises(FileNotFoundError) as info:
        serialization.save_file({"w": np.zeros(3, np.float32)}, path)
    assert str(path) in str(info.value) and ".tmp" not in str(info.value)


@posix_only
def test_a_save_over_a_link_to_dev_null_writes_a_regular_file_with_the_umask_mode(tmp_path):
    path = tmp_path / "m.safetensors"
    path.symlink_to(os.devnull)
    _save_ones_under_umask(path, 0o022)
    assert not path.is_symlink() and path.is_file()
    assert path.stat().st_mode & 0o777 == 0o644
    assert np.all(serialization.load_file(path)["w"] == 1)


@posix_only
def test_a_save_over_a_link_neither_copies_nor_changes_the_linked_file(tmp_path):
    linked = tmp_path / "elsewhere.safetensors"
    serialization.save_file({"w": np.zeros(3, np.float32)}, linked)
    linked.chmod(0o604)
    path = tmp_path / "m.safetensors"
    path.symlink_to(linked)
    _save_ones_under_umask(path, 0o077)
    assert not path.is_symlink() and path.stat().st_mode & 0o777 == 0o600
    assert linked.stat().st_mode & 0o777 == 0o604 and np.all(serialization.load_file(linked)["w"] == 0)
