"""A first run on a cold Numba kernel cache: one training step of a tiny model in a fresh
process compiles its kernels, saying so once on stderr; a second process on the same
cache loads them, prints nothing (``backends/numba/kernel_cache.announce_compiles``) and
trains to the same weights bit for bit (loaded machine code computes what it computed
when compiled).

Kernels compiled in a second process (``backends/numba/warmup.py``) load in the first
without compiling and compute the same bits; ``record`` lists what a block compiles; the
list of a default ``python -m diffusion train`` (``diffusion/cli/train_kernel_list.py``)
is what such a run compiles, and that run hands the list to a second process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from numba.core import types

import tensorcore as tc
from diffusion.cli import build_parser, train_kernel_list, train_kernels
from tensorcore.backends.numba import warmup
from tensorcore.backends.numba.kernel_cache import COMPILE_NOTICE

REPO = Path(__file__).resolve().parents[1]

# A Linear + GroupNorm + SiLU + Linear model, an MSE loss, AdamW: a handful of kernels
# (bias + activation, group norm, the activation gradient, the Adam update), so a cold
# cache compiles in seconds.
STEP = textwrap.dedent("""
    import hashlib
    import numpy as np
    import tensorcore as tc
    import tensorcore.functional as F
    from layers import GroupNorm, Linear, Module
    from optim import AdamW

    class Tiny(Module):
        def __init__(self):
            super().__init__()
            self.inp, self.norm, self.out = Linear(8, 16), GroupNorm(4, 16), Linear(16, 1)

        def forward(self, x):
            return self.out(F.silu(self.norm(self.inp(x))))

    tc.manual_seed(0)
    model = Tiny()
    optimizer = AdamW(model.parameters(), lr=1e-3)
    x = tc.tensor(np.random.default_rng(0).standard_normal((32, 8), dtype=np.float32))
    loss = F.mse_loss(model(x), tc.zeros(32, 1))
    loss.backward()
    optimizer.step()
    weights = hashlib.sha256(b"".join(p.numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
    print(f"backend {tc.get_backend().name}, loss {loss.item():.4f}, weights {weights}")
""")


def cold_env(cache: Path) -> dict[str, str]:
    """The environment of a process on the Numba kernel cache under ``cache`` (empty at first)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "NUMBA_CACHE_DIR": str(cache / "numba"),
           "TENSORCORE_CACHE_DIR": str(cache / "tensorcore")}
    env.pop("TENSORCORE_BACKEND", None)  # the default: numba
    return env


def run_step(cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", STEP], env=cold_env(cache), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_a_cold_cache_is_announced_once_and_a_warm_one_not_at_all(tmp_path) -> None:
    cold = run_step(tmp_path)
    assert cold.returncode == 0, cold.stderr
    assert cold.stdout.startswith("backend numba, loss ")
    assert cold.stderr.count(COMPILE_NOTICE) == 1, cold.stderr
    assert any((tmp_path / "numba").rglob("*.nbi"))  # the kernels went to the fresh cache

    warm = run_step(tmp_path)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout == cold.stdout  # kernels loaded from the cache compute what they computed compiled
    assert COMPILE_NOTICE not in warm.stderr, warm.stderr


@pytest.mark.parametrize("numba_type", [
    types.Array(types.float32, 4, "C"), types.Array(types.float64, 2, "A", readonly=True),
    types.Array(types.int64, 1, "C"), types.literal(4), types.none, types.boolean, types.int64, types.float64,
])
def test_an_argument_type_is_written_as_json_and_read_back(numba_type) -> None:
    data = json.loads(json.dumps(warmup.encode(numba_type)))
    assert warmup.decode(data) == numba_type


def test_an_argument_type_it_cannot_write_is_refused() -> None:
    with pytest.raises(TypeError, match="UniTuple|int64 x 2"):
        warmup.encode(types.UniTuple(types.int64, 2))
    with pytest.raises(ValueError, match="not an argument type"):
        warmup.decode("complex128")


# Two kernels (one per activation code for the second) and a generated fused loop (listed
# by its program and layout), compiled alone or under BackgroundCompiles; prints what the
# process compiled itself and whether a second process was started.
FLAT = {"array": "float32", "ndim": 1, "layout": "C", "readonly": False}
PROGRAM = [["float32", "float32"], [["binary", "mul", 0, 1], ["binary", "add", 2, 0]]]  # a * b + a
KERNELS = [
    {"module": "tensorcore.backends.numba.kernels.reductions", "name": "channel_sums",
     "args": [{"array": "float32", "ndim": 3, "layout": "C", "readonly": False}]},
    {"module": "tensorcore.backends.numba.kernels.activations", "name": "act_forward_flat",
     "args": [FLAT, {"literal": 4}]},
    {"fused": [PROGRAM, ":cc"], "name": "serial",
     "args": ["int64", "int64", FLAT, {**FLAT, "readonly": True}, {**FLAT, "readonly": True}]},
]
CALLS = textwrap.dedent("""
    import contextlib, json, sys
    import numpy as np
    from tensorcore.backends.numba import fused, warmup
    from tensorcore.backends.numba.kernels import activations, reductions

    entries, listing = json.loads(sys.argv[1]), warmup.record() if sys.argv[2] == "record" else contextlib.nullcontext()
    with warmup.BackgroundCompiles(entries) as background, listing as compiled:
        rng = np.random.default_rng(0)
        sums = reductions.channel_sums(rng.standard_normal((2, 3, 40), dtype=np.float32))
        silu = activations.act_forward_flat(rng.standard_normal(37, dtype=np.float32), activations.ACT_CODES["silu"])
        a, b, fma = np.arange(50, dtype=np.float32), np.full(50, 0.5, np.float32), np.empty(50, np.float32)
        program = (("float32", "float32"), (("binary", "mul", 0, 1), ("binary", "add", 2, 0)))
        fused.bind(program, [a, b], fma)()
    print(json.dumps({"compiled": compiled, "started": background.process is not None,
                      "sums": sums.tolist(), "silu": silu.tolist(), "fused": fma.tolist()}))
""")


def run_calls(cache: Path, entries: list, record: bool = True) -> dict:
    done = subprocess.run([sys.executable, "-c", CALLS, json.dumps(entries), "record" if record else "-"],
                          env=cold_env(cache),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_kernels_compiled_by_a_second_process_load_without_compiling(tmp_path) -> None:
    alone = run_calls(tmp_path / "alone", [])
    assert alone["compiled"] == KERNELS  # in order, the helpers they call left out
    assert not alone["started"]  # recording: no second process
    rng = np.random.default_rng(0)  # the inputs of CALLS
    x, v = rng.standard_normal((2, 3, 40), dtype=np.float32), rng.standard_normal(37, dtype=np.float32)
    np.testing.assert_allclose(alone["sums"], x.astype(np.float64).sum(axis=(0, 2)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(alone["silu"], v / (1 + np.exp(-v.astype(np.float64))), rtol=1e-5, atol=1e-6)
    assert alone["fused"] == (np.arange(50) * 1.5).tolist()

    worker = subprocess.run([sys.executable, "-m", "tensorcore.backends.numba.warmup"],
                            input=json.dumps(warmup.background_order(KERNELS)), env=cold_env(tmp_path / "shared"), capture_output=True,
                            text=True, timeout=300)
    assert worker.returncode == 0 and worker.stderr == "", worker.stderr
    loaded = run_calls(tmp_path / "shared", KERNELS)
    assert loaded["compiled"] == [] and not loaded["started"]  # a warm cache starts nothing
    assert (loaded["sums"], loaded["silu"], loaded["fused"]) == (alone["sums"], alone["silu"], alone["fused"])

    background = run_calls(tmp_path / "cold", KERNELS, record=False)
    assert background["started"]  # the first compile on a cold cache starts the second process
    assert (background["sums"], background["silu"], background["fused"]) == (alone["sums"], alone["silu"],
                                                                              alone["fused"])


def test_the_second_process_compiles_the_eager_kernels_from_the_back_first() -> None:
    eager = [{"module": "m", "name": f"k{i}", "args": []} for i in range(4)]
    fused = [{"fused": [PROGRAM, ":cc"], "name": name, "args": []} for name in ("serial", "parallel")]
    later = {"module": "m", "name": "after_the_plan", "args": []}
    assert warmup.background_order(eager + fused[:1] + [later] + fused[1:]) == (
        eager[::-1] + [fused[1], later, fused[0]])
    assert warmup.background_order(eager) == eager[::-1]
    assert warmup.background_order([]) == []


def test_a_listed_kernel_that_does_not_compile_is_reported_not_fatal(tmp_path) -> None:
    entries = [{"module": "tensorcore.backends.numba.kernels.reductions", "name": "no_such_kernel", "args": []}]
    worker = subprocess.run([sys.executable, "-m", "tensorcore.backends.numba.warmup"], input=json.dumps(entries),
                            env=cold_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert worker.returncode == 0
    assert "1 of 1 listed kernels did not compile" in worker.stderr and "no_such_kernel" in worker.stderr


@pytest.mark.slow
def test_the_train_kernel_list_is_what_a_default_run_compiles(tmp_path) -> None:
    recorded = train_kernels.record(tmp_path)  # the first step on empty caches, compiling alone
    assert recorded["options"] == train_kernel_list.OPTIONS
    assert recorded["kernels"] == train_kernel_list.KERNELS, (
        "diffusion/cli/train_kernel_list.py is out of date: run python -m diffusion.cli.train_kernels")


def test_a_default_train_run_compiles_the_list_in_a_second_process() -> None:
    """The CLI starts the background compiles (tested above) for the recorded options only."""
    args = build_parser().parse_args(train_kernels.RECORDED_COMMAND)
    options = train_kernels.shaping_options(args, args.image_size, latent=False)
    with tc.use_backend("numba"):
        chosen = train_kernels.background_compiles(options)
        assert isinstance(chosen, warmup.BackgroundCompiles) and chosen.entries == train_kernel_list.KERNELS
        assert not isinstance(train_kernels.background_compiles({**options, "batch_size": 7}),
                              warmup.BackgroundCompiles)
    with tc.use_backend("numpy"):
        assert not isinstance(train_kernels.background_compiles(options), warmup.BackgroundCompiles)


class _Running:
    """A stand-in for the second process: running until ``ended`` is set."""

    def __init__(self) -> None:
        self.ended = False

    def poll(self) -> int | None:
        return 0 if self.ended else None


def test_a_first_call_waits_while_the_second_process_compiles_that_kernel(tmp_path, monkeypatch) -> None:
    import threading
    import time

    from tensorcore.backends.numba import threads
    from tensorcore.backends.numba.kernels import reductions

    kernel = threads.SizedKernel(reductions.channel_sums.dispatcher)  # a fresh wrapper: not called yet
    background = warmup.BackgroundCompiles([])
    background.process, background.markers = _Running(), str(tmp_path)
    marker = tmp_path / warmup.marker_name(kernel.__module__, kernel.__name__)
    marker.touch()
    monkeypatch.setattr(threads, "before_first_call", background.wait_for)
    threading.Timer(0.3, marker.unlink).start()  # the other process finishes compiling
    start = time.monotonic()
    sums = kernel(np.ones((2, 3, 16), np.float32))
    assert time.monotonic() - start >= 0.25
    np.testing.assert_array_equal(sums, [32, 32, 32])
    marker.touch()  # only a first call waits
    start = time.monotonic()
    kernel(np.ones((2, 3, 16), np.float32))
    assert time.monotonic() - start < 0.25


def test_a_first_call_does_not_wait_for_an_ended_process(tmp_path) -> None:
    import time

    from tensorcore.backends.numba import threads
    from tensorcore.backends.numba.kernels import reductions

    kernel = threads.SizedKernel(reductions.channel_sums.dispatcher)
    background = warmup.BackgroundCompiles([])
    background.process, background.markers = _Running(), str(tmp_path)
    (tmp_path / warmup.marker_name(kernel.__module__, kernel.__name__)).touch()  # left by a killed process
    background.process.ended = True
    start = time.monotonic()
    background.wait_for(kernel)
    assert time.monotonic() - start < 0.25


def test_the_second_process_marks_each_kernel_while_it_compiles(tmp_path, monkeypatch) -> None:
    seen = []
    entry = KERNELS[0]
    marker = tmp_path / warmup.marker_name(entry["module"], entry["name"])

    class Dispatcher:
        py_func = type("kernel", (), {"__module__": entry["module"], "__qualname__": entry["name"]})

        def compile(self, signature):
            seen.append(marker.exists())

    monkeypatch.setattr(warmup, "dispatcher_of", lambda module, name: Dispatcher())
    assert warmup.compile_kernels([entry], str(tmp_path)) == []
    assert seen == [True] and not marker.exists()
