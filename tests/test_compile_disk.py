"""The disk cache: a second process reuses a plan without tracing; truncated, corrupted,
stale and planted files are ignored (logged once), rewritten, and never run code."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import layers
import optim
import tensorcore as tc
import tensorcore.functional as F
from tensorcore.compile import disk, signing

REPO = Path(tc.__file__).resolve().parents[1]

SCRIPT = """
import json, sys, time
import numpy as np
import layers, tensorcore as tc
tc.manual_seed(int(sys.argv[2]))  # other weights in each process: plans never depend on them
model = layers.Sequential(layers.Conv2d(3, 8, 3, padding=1), layers.GroupNorm(2, 8), layers.SiLU(),
                          layers.Conv2d(8, 4, 3, padding=1), layers.Flatten(), layers.Linear(256, 5))
compiled = tc.compile(model, cache_dir=sys.argv[1])
x = tc.randn(2, 3, 8, 8)
with tc.no_grad():
    want = model(x).numpy()
    start = time.perf_counter()
    first = compiled(x).numpy()
    first_ms = (time.perf_counter() - start) * 1e3
    second = compiled(x).numpy()
print(json.dumps({"info": compiled.cache_info()._asdict(), "first_ms": first_ms,
                  "same": bool(np.array_equal(first, want) and np.array_equal(second, want))}))
"""


def _process(tmp_path: Path, seed: int) -> dict:
    env = dict(os.environ, TENSORCORE_BACKEND="numpy", PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(seed)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_reuses_the_plan_without_tracing(tmp_path):
    first = _process(tmp_path, 1)
    second = _process(tmp_path, 2)
    assert first["same"] and second["same"]
    assert first["info"]["traces"] == 1 and first["info"]["disk_loads"] == 0
    assert second["info"]["traces"] == 0 and second["info"]["disk_loads"] == 1 and second["info"]["hits"] == 1
    assert len(list(tmp_path.rglob("*.json"))) == 1


# ----- in-process helpers: a new compiled callable has no plan in memory ----------------------
def _model(width: int = 8) -> layers.Module:
    tc.manual_seed(0)
    return layers.Sequential(layers.Linear(4, width), layers.GELU(), layers.LayerNorm(width), layers.Linear(width, 2))


def _call(model: layers.Module, tmp_path: Path) -> tuple[tc.Tensor, tuple]:
    compiled = tc.compile(model, cache_dir=tmp_path)
    x = tc.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    with tc.no_grad():
        got, want = compiled(x), model(x)
    assert np.array_equal(got.numpy(), want.numpy())
    return got, compiled.cache_info()


def _plan_file(tmp_path: Path) -> Path:
    files = list(tmp_path.rglob("*.json"))
    assert len(files) == 1, files
    return files[0]


def _rewrite(path: Path, mutate) -> None:
    """Change the body and sign it again with the user's own key (which a forger has
    not), so the checks behind the signature are what rejects it."""
    document = json.loads(path.read_bytes())
    mutate(document["body"])
    document["mac"] = signing.sign(disk.canonical(document["body"]))
    path.write_bytes(disk.canonical(document))


def test_plan_is_reused_in_process_and_weights_do_not_matter(tmp_path):
    _, info = _call(_model(), tmp_path)
    assert info.traces == 1
    other = _model()
    with tc.no_grad():
        for p in other.parameters():
            p.mul_(-2.0)
    _, info = _call(other, tmp_path)
    assert info.traces == 0 and info.disk_loads == 1


def test_another_structure_gets_another_plan(tmp_path):
    _call(_model(8), tmp_path)
    _, info = _call(_model(9), tmp_path)
    assert info.traces == 1 and len(list(tmp_path.rglob("*.json"))) == 2


def _corrupt_and_check(tmp_path: Path, caplog, corrupt, reason: str) -> None:
    _call(_model(), tmp_path)
    path = _plan_file(tmp_path)
    corrupt(path)
    with caplog.at_level(logging.WARNING, logger="tensorcore.compile"):
        _, info = _call(_model(), tmp_path)
    assert info.traces == 1 and info.disk_loads == 0
    warnings = [r for r in caplog.records if "ignoring the cached plan" in r.getMessage()]
    assert len(warnings) == 1 and reason in warnings[0].getMessage()
    _, info = _call(_model(), tmp_path)  # rewritten by the trace
    assert info.disk_loads == 1 and info.traces == 0


def test_truncated_file_is_ignored_and_rewritten(tmp_path, caplog):
    _corrupt_and_check(tmp_path, caplog, lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "")


def test_flipped_byte_fails_the_signature(tmp_path, caplog):
    def flip(p: Path) -> None:
        data = bytearray(p.read_bytes())
        i = data.index(b'"arena_bytes":') + len(b'"arena_bytes":')  # a digit of a number: still valid JSON
        data[i] = ord("7") if data[i] != ord("7") else ord("8")
        p.write_bytes(bytes(data))
    _corrupt_and_check(tmp_path, caplog, flip, "signature mismatch")


class _Exploit:
    def __reduce__(self):
        return (open, (str(_Exploit.marker), "w"))


def test_planted_pickle_is_ignored_and_runs_nothing(tmp_path, caplog):
    _Exploit.marker = tmp_path / "pwned"
    _corrupt_and_check(tmp_path, caplog, lambda p: p.write_bytes(pickle.dumps(_Exploit())), "")
    assert not _Exploit.marker.exists()


@pytest.mark.parametrize("forge, reason", [
    (lambda b: b["plan"]["nodes"][0].__setitem__(1, "__class__"), "bad node"),
    (lambda b: b["plan"]["nodes"][0].__setitem__(1, "to_numpy"), "bad node"),
    (lambda b: b["plan"]["nodes"][0].__setitem__(2, {"eval": "__import__('os').system('true')"}), "unknown tag"),
    (lambda b: b["plan"]["values"][-1].__setitem__(1, 1 << 40), "outside its buffer"),
    (lambda b: b["plan"]["storages"][1].__setitem__(7, "no.such.weight"), "no tensor named"),
    (lambda b: b["plan"]["lowered"].__setitem__("arena_bytes", 1), "lowering does not match"),
    (lambda b: b.__setitem__("tensorcore", "0.0.1"), "stale"),
    (lambda b: b.__setitem__("sources", "0" * 64), "stale"),
])
def test_forged_plans_are_rejected(tmp_path, caplog, forge, reason):
    _corrupt_and_check(tmp_path, caplog, lambda p: _rewrite(p, forge), reason)


def test_a_bad_file_is_logged_once(tmp_path, caplog):
    cache = disk.DiskCache(tmp_path)
    path = cache.path("key", "model")
    path.parent.mkdir(parents=True)
    path.write_text("not json")
    with caplog.at_level(logging.WARNING, logger="tensorcore.compile"):
        for _ in range(3):
            assert cache.load("key", "model", [], tc.get_backend(), []) is None
    assert len([r for r in caplog.records if "ignoring the cached plan" in r.getMessage()]) == 1


def test_cache_dir_false_and_the_environment_variable(tmp_path, monkeypatch):
    model = _model()
    compiled = tc.compile(model, cache_dir=False)
    compiled(tc.randn(3, 4))
    monkeypatch.setenv("TENSORCORE_CACHE_DIR", str(tmp_path / "env"))
    compiled = tc.compile(model)
    compiled(tc.randn(3, 4))
    assert len(list((tmp_path / "env").rglob("*.json"))) == 1
    with pytest.raises(TypeError, match="cache_dir"):
        tc.compile(model, cache_dir=3)


def test_plans_with_host_effects_stay_in_memory(tmp_path):
    model = _model()
    opt = optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        loss = F.mse_loss(model(x), tc.zeros(3, 2))
        loss.backward()
        opt.step()
        return loss

    compiled = tc.compile(step, cache_dir=tmp_path)
    for _ in range(4):
        compiled(tc.randn(3, 4))
    assert compiled.cache_info().hits >= 1 and not list(tmp_path.rglob("*.json"))
