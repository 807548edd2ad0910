"""Numba's cache of the kernels is keyed by a fingerprint of every source they inline
(``backends/numba/kernel_cache.py``)."""

import shutil

import pytest

from tensorcore.backends.numba import kernel_cache


def _cached(directory):
    return sorted(p.name for p in directory.iterdir() if p.suffix in (".nbi", ".nbc"))


def _fill(directory):
    for name in ("softmax.softmax_rows-33.py311.nbi", "softmax.softmax_rows-33.py311.1.nbc"):
        (directory / name).write_bytes(b"machine code")


def test_a_changed_fingerprint_clears_the_cached_kernels_once(tmp_path):
    _fill(tmp_path)
    (tmp_path / "unrelated.txt").write_text("kept")
    assert kernel_cache.refresh([tmp_path], current="old") == [tmp_path]  # no stamp yet
    assert _cached(tmp_path) == []
    _fill(tmp_path)  # compiled from the "old" sources
    assert kernel_cache.refresh([tmp_path], current="old") == []
    assert len(_cached(tmp_path)) == 2
    assert kernel_cache.refresh([tmp_path], current="new") == [tmp_path]
    assert _cached(tmp_path) == [] and (tmp_path / "unrelated.txt").exists()
    assert (tmp_path / kernel_cache.STAMP).read_text() == "new"


def test_a_missing_directory_is_left_alone(tmp_path):
    assert kernel_cache.refresh([tmp_path / "absent"], current="x") == []
    assert not (tmp_path / "absent").exists()


@pytest.fixture
def kernel_copy(tmp_path, monkeypatch):
    """The fingerprint of a temporary copy of the kernel sources."""
    copy = tmp_path / "kernels"
    shutil.copytree(kernel_cache.KERNELS_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    opcodes = tmp_path / "opcodes.py"
    shutil.copy(kernel_cache.OPCODES, opcodes)
    monkeypatch.setattr(kernel_cache, "KERNELS_DIR", copy)
    monkeypatch.setattr(kernel_cache, "OPCODES", opcodes)
    kernel_cache.fingerprint.cache_clear()
    yield copy, opcodes
    kernel_cache.fingerprint.cache_clear()


def test_editing_an_inlined_helper_or_an_op_code_changes_the_fingerprint(kernel_copy):
    kernels, opcodes = kernel_copy
    before = kernel_cache.fingerprint()
    assert kernel_cache.sources()[-1] == opcodes and kernels / "mathfn.py" in kernel_cache.sources()
    with open(kernels / "mathfn.py", "a") as f:
        f.write("\n# edited\n")
    kernel_cache.fingerprint.cache_clear()
    edited = kernel_cache.fingerprint()
    assert edited != before
    with open(opcodes, "a") as f:
        f.write("\n# edited\n")
    kernel_cache.fingerprint.cache_clear()
    assert kernel_cache.fingerprint() not in (before, edited)


def test_fused_kernels_live_under_the_fingerprint(kernel_copy, monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORCORE_CACHE_DIR", str(tmp_path / "cache"))
    assert kernel_cache.fused_dir() == tmp_path / "cache" / "kernels" / "numba" / kernel_cache.fingerprint()[:16]


def test_the_stamp_sits_where_numba_caches_the_kernels():
    import tensorcore.backends.numba.kernels  # noqa: F401  (runs refresh on first import)

    (directory,) = kernel_cache.cache_dirs()
    assert (directory / kernel_cache.STAMP).read_text() == kernel_cache.fingerprint()
