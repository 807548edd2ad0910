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

import io
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
from tensorcore.backends.numba import kernel_cache, warmup
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
    env.pop("TENSORCORE_COMPILE_PROCESSES", None)  # the default count
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
    print(json.dumps({"compiled": compiled, "started": bool(background.processes),
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
                            input=json.dumps(KERNELS), env=cold_env(tmp_path / "shared"), capture_output=True,
                            text=True, timeout=300)
    assert worker.returncode == 0 and worker.stderr == "", worker.stderr
    assert worker.stdout.splitlines() == [warmup.entry_key(entry) for entry in KERNELS]  # each when compiled
    loaded = run_calls(tmp_path / "shared", KERNELS)
    assert loaded["compiled"] == [] and not loaded["started"]  # a warm cache starts nothing
    assert (loaded["sums"], loaded["silu"], loaded["fused"]) == (alone["sums"], alone["silu"], alone["fused"])

    background = run_calls(tmp_path / "cold", KERNELS, record=False)
    assert background["started"]  # the first compile on a cold cache starts the second process
    assert (background["sums"], background["silu"], background["fused"]) == (alone["sums"], alone["silu"],
                                                                              alone["fused"])


def test_a_listed_kernel_that_does_not_compile_is_reported_not_fatal(tmp_path) -> None:
    entries = [{"module": "tensorcore.backends.numba.kernels.reductions", "name": "no_such_kernel", "args": []}]
    worker = subprocess.run([sys.executable, "-m", "tensorcore.backends.numba.warmup"], input=json.dumps(entries),
                            env=cold_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert worker.returncode == 0
    assert worker.stdout == warmup.entry_key(entries[0]) + "\n"  # done, so nothing waits for it
    assert "1 kernels did not compile" in worker.stderr and "no_such_kernel" in worker.stderr


@pytest.mark.slow
def test_the_train_kernel_list_is_what_a_default_run_compiles(tmp_path) -> None:
    recorded = train_kernels.record(tmp_path)  # the first step on empty caches, compiling alone
    assert recorded["options"] == train_kernel_list.OPTIONS
    assert recorded["kernels"] == train_kernel_list.KERNELS, (
        "diffusion/cli/train_kernel_list.py is out of date: run python -m diffusion.cli.train_kernels")


def test_a_train_run_compiles_in_other_processes_starting_with_the_list_for_its_options(monkeypatch) -> None:
    """The CLI hands the recorded list to the background compiles for the recorded options
    only; another run starts with an empty list and hands over what its steps meet;
    ``TENSORCORE_COMPILE_PROCESSES`` sets how many processes, 0 none."""
    args = build_parser().parse_args(train_kernels.RECORDED_COMMAND)
    options = train_kernels.shaping_options(args, args.image_size, latent=False)
    monkeypatch.delenv("TENSORCORE_COMPILE_PROCESSES", raising=False)
    with tc.use_backend("numba"):
        chosen = train_kernels.background_compiles(options)
        assert isinstance(chosen, warmup.BackgroundCompiles) and chosen.entries == train_kernel_list.KERNELS
        assert 2 <= chosen._count <= 4
        other = train_kernels.background_compiles({**options, "batch_size": 7})
        assert isinstance(other, warmup.BackgroundCompiles) and other.entries == []
        monkeypatch.setenv("TENSORCORE_COMPILE_PROCESSES", "3")
        assert train_kernels.background_compiles(options)._count == 3
        monkeypatch.setenv("TENSORCORE_COMPILE_PROCESSES", "0")
        assert not isinstance(train_kernels.background_compiles(options), warmup.BackgroundCompiles)
        monkeypatch.setenv("TENSORCORE_COMPILE_PROCESSES", "two")
        with pytest.raises(ValueError, match="TENSORCORE_COMPILE_PROCESSES .* got 'two'"):
            train_kernels.background_compiles(options)
    monkeypatch.delenv("TENSORCORE_COMPILE_PROCESSES")
    with tc.use_backend("numpy"):
        assert not isinstance(train_kernels.background_compiles(options), warmup.BackgroundCompiles)


# On a cold cache under BackgroundCompiles: a backend call runs the NumPy reference while
# its kernel compiles in the other process, this process's threads drop to one, a
# compiled call runs eagerly; then the kernel loads from the cache, compiled nowhere here.
DEFERRED = textwrap.dedent("""
    import json, time
    import numpy as np
    import tensorcore as tc
    import tensorcore.functional as F
    from tensorcore.backends.numba import warmup
    from tensorcore.backends.numba.kernels import activations

    x = np.random.default_rng(0).standard_normal((64, 300)).astype(np.float32)
    with tc.use_backend("numpy"):
        reference = F.silu(tc.tensor(x)).numpy()
    tc.set_num_threads(2)
    before = tc.get_num_threads()
    doubled = tc.compile(lambda a: F.silu(a) * 2)
    with warmup.BackgroundCompiles([], processes=1) as background:
        first = F.silu(tc.tensor(x)).numpy()
        pending, threads_while = background.pending(), tc.get_num_threads()
        doubled(tc.tensor(x))
        info_while = doubled.cache_info()
        deadline = time.monotonic() + 240
        while background.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        threads_after = tc.get_num_threads()
        second = F.silu(tc.tensor(x)).numpy()
        stats = activations.act_forward_flat.dispatcher.stats
        doubled(tc.tensor(x)), doubled(tc.tensor(x))
        info_after = doubled.cache_info()
    print(json.dumps({"first_is_reference": first.tobytes() == reference.tobytes(),
                      "second_error": float(np.abs(second - reference).max()), "pending": pending,
                      "threads": [before, threads_while, threads_after],
                      "loads": sum(stats.cache_hits.values()), "overloads": len(activations.act_forward_flat.dispatcher.overloads),
                      "info_while": [info_while.traces, info_while.fallbacks],
                      "info_after": [info_after.traces, info_after.hits]}))
""")


@pytest.mark.slow
def test_a_call_whose_kernel_compiles_elsewhere_runs_the_reference_until_it_loads(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-c", DEFERRED], env=cold_env(tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["first_is_reference"] and result["pending"]
    assert result["second_error"] < 1e-6  # the Numba kernel, loaded from the cache
    assert result["loads"] == result["overloads"] == 1  # loaded from the disk cache, not compiled here
    before = result["threads"][0]
    assert result["threads"] == [before, 1, before]
    assert result["info_while"] == [0, 1]  # run eagerly: no plan bound to the stand-ins
    assert result["info_after"] == [1, 1]  # traced once pending is over, then replayed
    assert kernel_cache.DEFERRED_NOTICE in done.stderr and COMPILE_NOTICE not in done.stderr


@pytest.mark.slow
def test_a_cold_train_run_says_once_that_its_kernels_compile_elsewhere(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "diffusion", "train", "--steps", "3", "--batch-size", "8",
                           "--channels", "8,16", "--per-class", "1", "--sample-steps", "2", "--log-every", "1",
                           "--no-progress", "--out", str(tmp_path / "run")],
                          env=cold_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(kernel_cache.DEFERRED_NOTICE) == 1 and COMPILE_NOTICE not in done.stderr, done.stderr
    assert len((tmp_path / "run" / "metrics.csv").read_text().splitlines()) == 4
    assert (tmp_path / "run" / "samples.png").is_file()


def test_a_pending_kernel_hands_its_call_to_the_reference_with_its_out(monkeypatch) -> None:
    from tensorcore.backends.numba import deferral

    def pending(self, *args, **kwargs):
        raise deferral.KernelPending("a kernel")

    rng = np.random.default_rng(1)
    grad, w = rng.standard_normal((2, 4, 5, 5)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    geometry = ((2, 3, 5, 5), (1, 1), (1, 1), (1, 1), 1)
    served = deferral.deferrable("conv2d_grad_input", pending)
    with tc.use_backend("numpy"):
        expected = tc.get_backend().conv2d_grad_input(grad, w, *geometry)
    with tc.use_backend("numba"):
        backend = tc.get_backend()
        with pytest.raises(deferral.KernelPending):  # nothing compiles elsewhere: not deferred
            served(backend, grad, w, *geometry)
        monkeypatch.setattr(deferral, "compiler", type("Compiling", (), {"pending": lambda self: True})())
        out = np.full((2, 3, 5, 5), np.nan, np.float32)
        assert served(backend, grad, w, *geometry, out=out) is out
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(served(backend, grad, w, *geometry), expected)
        assert backend.kernels_pending()


class _Worker:
    """A stand-in for a compiling process: takes its lines, never ends unless told."""

    def __init__(self) -> None:
        self.stdin, self.stdout, self.ended = io.StringIO(), iter(()), False

    def poll(self) -> int | None:
        return 0 if self.ended else None

    def handed(self) -> list[str]:
        return [warmup.entry_key(entry) for line in self.stdin.getvalue().splitlines()
                for entry in json.loads(line)]


def _started(entries: list, workers: int, monkeypatch) -> warmup.BackgroundCompiles:
    """BackgroundCompiles over stand-in processes, inside a deferrable call."""
    from tensorcore.backends.numba import deferral, threads

    threads.configure()  # set up first: BackgroundCompiles leaves unset pools alone
    background = warmup.BackgroundCompiles(entries, processes=workers)
    background.processes = [_Worker() for _ in range(workers)]
    with background._lock:
        for index in range(workers):
            background._hand_next(index)
    monkeypatch.setattr(deferral._calls, "depth", 1, raising=False)
    return background


def test_kernels_go_to_free_processes_the_asked_for_ahead_of_the_list(monkeypatch) -> None:
    from tensorcore.backends.numba import deferral
    from tensorcore.backends.numba.kernels import reductions

    listed = [{"module": "m", "name": f"k{i}", "args": []} for i in range(3)]
    background = _started(listed, 2, monkeypatch)
    try:
        first, second = background.processes
        assert (first.handed(), second.handed()) == ([warmup.entry_key(listed[0])], [warmup.entry_key(listed[1])])
        args = (types.Array(types.float32, 3, "C"),)
        asked = {"module": reductions.__name__, "name": "channel_sums", "args": [warmup.encode(args[0])]}
        with pytest.raises(deferral.KernelPending):
            background.take_over(reductions.channel_sums.dispatcher, args)
        with background._lock:
            background._compiled.add(warmup.entry_key(listed[0]))
            background._hand_next(0)  # the first process is done: the asked-for kernel comes next
        assert first.handed()[1:] == [warmup.entry_key(asked)]
        with pytest.raises(deferral.KernelPending):  # asked again while it compiles: still pending
            background.take_over(reductions.channel_sums.dispatcher, args)
        assert background.pending() and tc.get_num_threads() == 1
        for index in (0, 1, 0):  # everything done
            with background._lock:
                background._hand_next(index)
        assert not background.pending()
        assert background.take_over(reductions.channel_sums.dispatcher, args) is None  # compiled, not in the cache: here
    finally:
        with background._lock:
            background._in_flight.clear()
            background._share_cores()


def test_a_kernel_lost_with_an_ended_process_compiles_here(monkeypatch) -> None:
    from tensorcore.backends.numba import deferral
    from tensorcore.backends.numba.kernels import reductions

    background = _started([], 1, monkeypatch)
    try:
        args = (types.Array(types.float32, 3, "C"),)
        with pytest.raises(deferral.KernelPending):
            background.take_over(reductions.channel_sums.dispatcher, args)
        with background._lock:
            background._in_flight.clear()  # its process's output ended before the kernel was done
            background._share_cores()
        assert background.take_over(reductions.channel_sums.dispatcher, args) is None
        background.processes[0].ended = True
        assert not background.pending()
    finally:
        with background._lock:
            background._in_flight.clear()
            background._share_cores()
