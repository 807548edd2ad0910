"""tensorcore.distributed on the CPU.

In this process: the launcher's variables, the TCP store's rendezvous and its timeouts,
the checks every collective makes before it communicates, gradient buckets, the
sampler, the launcher, the autograd hooks DDP rides on, and the errors of sharded
optimizer state.  Under ``mpiexec -n 2`` (``tests/distributed_worker.py``): every
collective and dtype against NumPy; the tiny digits UNet trained data-parallel (plain,
ZeRO-1, compiled, with ``no_sync``) equal to one process on the global batch; a rank
that dies failing the other within the timeout; ``python -m diffusion train --devices 2``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorcore as tc
import tensorcore.distributed as dist
from layers import Linear
from optim import LAMB, SGD, AdamW
from tensorcore.distributed import buckets, environment, group, mpi, store
from tensorcore.distributed.run import free_port, launch, mpiexec

REPO = Path(__file__).resolve().parents[1]
WORKER = str(REPO / "tests" / "distributed_worker.py")


# ----- where a process sits ---------------------------------------------------------------
def test_placement_from_the_launchers_variables() -> None:
    assert environment.placement({}) == environment.Placement(0, 1, 0, "none")
    found = environment.placement({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500"})
    assert (found.rank, found.world_size, found.local_rank, found.launcher) == (1, 2, 1, "env")
    assert (found.master_addr, found.master_port) == ("127.0.0.1", 29500)
    mpi = environment.placement({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1"})
    assert (mpi.rank, mpi.world_size, mpi.local_rank, mpi.launcher) == (3, 4, 1, "mpiexec")


@pytest.mark.parametrize("variables, match", [
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "outside the world of 2"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK must be a non-negative integer"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_PORT is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1", "PMI_RANK": "1", "PMI_SIZE": "2"}, "disagree with mpiexec"),
])
def test_bad_launcher_variables_are_named(variables: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        environment.placement(variables)


# ----- the TCP store ------------------------------------------------------------------------
def _share_in_threads(world: int, worlds: list[int], port: int, timeout: float) -> list[Any]:
    """Run ``store.share`` for ranks 0..world-1 (rank r claiming world size worlds[r]); each
    rank's result or exception."""
    results: list[Any] = [None] * world

    def rank(r: int) -> None:
        try:
            results[r] = store.share(b"unique id" if r == 0 else None, r, worlds[r], "127.0.0.1", port, timeout)
        except Exception as exc:  # noqa: BLE001  (the test inspects it)
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return results


def test_the_store_hands_rank_0s_id_to_every_rank() -> None:
    assert _share_in_threads(3, [3, 3, 3], free_port(), 10.0) == [b"unique id"] * 3


def test_a_rank_that_never_arrives_is_named_after_the_timeout() -> None:
    start = time.monotonic()
    results = _share_in_threads(2, [3, 3], free_port(), 0.5)  # rank 2 of 3 never comes
    assert time.monotonic() - start < 5
    assert isinstance(results[0], RuntimeError) and "rank(s) [2] of 3 never arrived" in str(results[0])
    assert isinstance(results[1], (RuntimeError, ValueError)) and "rank 0" in str(results[1])


def test_mismatched_world_sizes_fail_both_sides() -> None:
    results = _share_in_threads(2, [2, 3], free_port(), 5.0)
    assert all(isinstance(r, ValueError) and "mismatched world sizes" in str(r) for r in results), results


def test_no_master_fails_after_the_timeout() -> None:
    with pytest.raises(RuntimeError, match=r"rank 1 could not reach rank 0 at 127.0.0.1:\d+ within 0.3 s"):
        store.share(None, 1, 2, "127.0.0.1", free_port(), 0.3)


# ----- the process group and the checks before any communication ------------------------------
class Loopback:
    """A communicator of one rank on the CPU (a collective over one rank copies)."""

    backend, device, rank, world_size = "loopback", "cpu", 0, 1

    def __init__(self) -> None:
        self.calls: list[str] = []

    def run(self, op: str, dst: Any, src: Any, reduce: str = "sum", root: int = 0, overlap: bool = False) -> None:
        self.calls.append(op)
        if op not in ("wait", "barrier") and src is not None and src is not dst:
            np.copyto(dst.reshape(-1), src.reshape(-1))


@pytest.fixture
def loopback(monkeypatch: pytest.MonkeyPatch) -> Loopback:
    communicator = Loopback()
    monkeypatch.setattr(group._group, "communicator", communicator)
    return communicator


def test_mpi_refuses_ranks_it_did_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    class LoneMpiProcess(Loopback):  # what each process started by the env-var launcher finds: a world of one
        def __init__(self, timeout: float) -> None:
            super().__init__()

    monkeypatch.setattr(mpi, "MpiCommunicator", LoneMpiProcess)
    with pytest.raises(ValueError, match="mismatched world sizes: the launcher says 2 processes, MPI's world has 1"):
        group._mpi(environment.Placement(0, 2, 0, "env", master_port=1), 1.0)


def test_init_refuses_bad_arguments_and_calls_before_init() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        dist.init("gloo")
    with pytest.raises(ValueError, match="timeout must be a positive"):
        dist.init("mpi", timeout=0)
    with pytest.raises(RuntimeError, match="get_rank: tensorcore.distributed is not initialized"):
        dist.get_rank()
    with pytest.raises(RuntimeError, match="all_reduce: tensorcore.distributed is not initialized"):
        dist.all_reduce(tc.ones(2))


@pytest.mark.skipif(tc.cuda.is_available(), reason="here NCCL could start")
def test_nccl_without_cupy_names_what_is_missing() -> None:
    with pytest.raises(RuntimeError, match=r"init\('nccl'\): CuPy"):
        dist.init("nccl")
    assert not dist.is_initialized()


def test_collectives_check_their_arguments_first(loopback: Loopback) -> None:
    x = tc.ones(4, 3)
    cases = [
        (lambda: dist.all_reduce(x, "mean"), ValueError, "op must be one of"),
        (lambda: dist.all_reduce(tc.ones(3, dtype=tc.int64), "avg"), TypeError, "'avg' needs a floating-point"),
        (lambda: dist.all_reduce(tc.ones(3) > 0), TypeError, "cannot reduce a bool"),
        (lambda: dist.all_reduce(x.T), ValueError, r"shape \(3, 4\) is not contiguous"),
        (lambda: dist.broadcast(x, src=1), ValueError, r"src must be a rank in 0..0"),
        (lambda: dist.all_gather(tc.ones(5, 3), x), ValueError, r"output must be float32 \(1, 4, 3\) or \(4, 3\)"),
        (lambda: dist.all_gather([x, x], x), ValueError, r"one tensor per rank \(1\), got 2"),
        (lambda: dist.reduce_scatter(tc.ones(2), tc.ones(3)), ValueError, r"input must be float32"),
        (lambda: dist.all_reduce(np.ones(3)), TypeError, "expected a Tensor"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()
    assert loopback.calls == []


def test_collectives_bump_the_write_version(loopback: Loopback) -> None:
    x = tc.ones(3)
    before = x._version
    dist.all_reduce(x)
    out = tc.zeros(1, 3)
    dist.all_gather(out, x)
    assert x._version > before and np.array_equal(out.numpy(), np.ones((1, 3)))
    assert loopback.calls == ["all_reduce", "all_gather"]


# ----- gradient buckets and DDP -----------------------------------------------------------------
def test_buckets_run_backwards_and_split_by_size_and_dtype() -> None:
    params = [tc.zeros(100), tc.zeros(100), tc.zeros(10, dtype=tc.float64), tc.zeros(300), tc.zeros(50)]
    assert buckets.plan_buckets(params, 1000) == [[4], [3], [2], [1, 0]]  # 300 floats fill a bucket alone
    assert buckets.plan_buckets(params, 10**6) == [[4, 3], [2], [1, 0]]


def test_flat_buffer_gradients_are_reduced_as_one_span(loopback: Loopback) -> None:
    tc.manual_seed(0)
    layer = Linear(5, 3)
    model = dist.DistributedDataParallel(layer)
    optimizer = SGD(layer.parameters(), lr=0.1)
    for _ in range(2):  # the first step makes the gradients views of the optimizer's flat buffer
        optimizer.zero_grad(set_to_none=False)
        model(tc.ones(2, 5)).sum().backward()
        optimizer.step()
    (span,) = model.reducer.reduced
    assert model.reducer.staged == [] and span.size >= 15 + 3
    assert loopback.calls == ["broadcast", "broadcast"] + ["all_reduce", "wait"] * 2


def test_separate_gradients_are_staged_and_copied_back(loopback: Loopback) -> None:
    tc.manual_seed(0)
    layer = Linear(5, 3)
    model = dist.DistributedDataParallel(layer)
    model(tc.ones(2, 5)).sum().backward()
    assert len(model.reducer.staged) == 1
    assert np.allclose(layer.weight.grad.numpy(), 2.0) and np.allclose(layer.bias.grad.numpy(), 2.0)
    with model.no_sync():
        model(tc.ones(2, 5)).sum().backward()
    assert loopback.calls.count("all_reduce") == 1 and np.allclose(layer.bias.grad.numpy(), 4.0)


def test_ddp_refuses_what_it_cannot_wrap(loopback: Loopback) -> None:
    with pytest.raises(TypeError, match="expected a Module"):
        dist.DistributedDataParallel(lambda x: x)
    with pytest.raises(ValueError, match="bucket_mb must be > 0"):
        dist.DistributedDataParallel(Linear(2, 2), bucket_mb=0)
    with pytest.raises(ValueError, match="no parameter that requires grad"):
        dist.DistributedDataParallel(Linear(2, 2).requires_grad_(False))


# ----- autograd hooks ------------------------------------------------------------------------------
def test_post_accumulate_hooks_see_complete_gradients_then_the_callback_runs() -> None:
    w = tc.ones(3, requires_grad=True)
    seen: list[Any] = []

    def hook(t: tc.Tensor) -> None:
        seen.append(t.grad.numpy().copy())
        tc.autograd.queue_callback(lambda: seen.append("end"))

    handle = w.register_post_accumulate_grad_hook(hook)
    (w * w + 3 * w).sum().backward()  # two uses of w: one complete gradient, one call
    assert len(seen) == 2 and np.allclose(seen[0], 5.0) and seen[1] == "end"
    handle.remove()
    (w * 2).sum().backward()
    assert len(seen) == 2
    with pytest.raises(RuntimeError, match="not a leaf"):
        (w * 2).register_post_accumulate_grad_hook(hook)
    with pytest.raises(RuntimeError, match="no backward pass is running"):
        tc.autograd.queue_callback(lambda: None)


# ----- the sampler -----------------------------------------------------------------------------
def test_sampler_shares_are_disjoint_and_cover_the_dataset() -> None:
    shares = [list(dist.DistributedSampler(10, num_replicas=3, rank=r, seed=1)) for r in range(3)]
    assert [len(s) for s in shares] == [4, 4, 4]
    assert sorted(set(sum(shares, []))) == list(range(10))  # two indices repeat as padding
    dropped = [list(dist.DistributedSampler(10, 3, r, drop_last=True)) for r in range(3)]
    assert sum(map(len, dropped)) == 9 and len(set(sum(dropped, []))) == 9
    sampler = dist.DistributedSampler(range(10), 2, 0)
    first = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != first
    assert list(dist.DistributedSampler(4, 2, 1, shuffle=False)) == [1, 3]
    with pytest.raises(ValueError, match="rank 2 is not in 0..1"):
        dist.DistributedSampler(4, 2, 2)


# ----- sharded optimizer state: errors (the equality runs under mpiexec) --------------------------
def test_shard_state_refuses_per_parameter_updates_and_a_late_call(loopback: Loopback) -> None:
    layer = Linear(2, 2)
    with pytest.raises(ValueError, match="LAMB.shard_state: its update needs whole parameters"):
        LAMB(layer.parameters()).shard_state()
    optimizer = AdamW(layer.parameters())
    optimizer.zero_grad(set_to_none=False)
    with pytest.raises(RuntimeError, match="before the first step"):
        optimizer.shard_state()


def test_sharded_state_on_one_rank_steps_as_unsharded(loopback: Loopback) -> None:
    params = []
    for shard in (False, True):
        tc.manual_seed(0)
        layer = Linear(4, 3)
        optimizer = AdamW(layer.parameters(), lr=0.1)
        if shard:
            optimizer.shard_state()
            with pytest.raises(RuntimeError, match="the state is sharded"):
                _ = optimizer.state
        for _ in range(2):
            optimizer.zero_grad()
            layer(tc.ones(2, 4)).sum().backward()
            optimizer.step()
        params.append([p.numpy().copy() for p in layer.parameters()])
        state = optimizer.state_dict()["state"][0]
        assert state["exp_avg"].shape == (3, 4) and state["step"] == 2
    assert all(np.array_equal(a, b) for a, b in zip(*params))


# ----- the launcher ------------------------------------------------------------------------------
def test_the_launcher_sets_the_variables_of_every_rank(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    out = tmp_path / "out"
    script.write_text(textwrap.dedent(f"""
        import os
        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NCCL_NVLS_ENABLE")
        with open({str(out)!r} + os.environ["RANK"], "w") as f:
            f.write(" ".join(os.environ[k] for k in keys))
    """))
    assert launch([sys.executable, str(script)], 2) == 0
    ranks = [(out.parent / f"out{r}").read_text().split() for r in range(2)]
    assert [r[:3] for r in ranks] == [["0", "0", "2"], ["1", "1", "2"]]
    assert ranks[0][3:] == ranks[1][3:] and ranks[0][5] == "0"


def test_a_failing_rank_stops_the_others(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(60)\n")
    start = time.monotonic()
    assert launch([sys.executable, str(script)], 2) == 3
    assert time.monotonic() - start < 20
    assert "rank 1 exited with status 3; stopping the others" in capfd.readouterr().err


# ----- two MPI ranks -------------------------------------------------------------------------------
def _mpi_available() -> bool:
    try:
        mpiexec()
    except RuntimeError:
        return False
    return importlib.util.find_spec("mpi4py") is not None


needs_mpi = pytest.mark.skipif(not _mpi_available(), reason="needs mpi4py and mpiexec (pip install mpich mpi4py)")


def _mpiexec(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([mpiexec(), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, "TENSORCORE_BACKEND": "numpy", **(env or {})})


@needs_mpi
def test_two_mpi_ranks_match_numpy_and_train_like_one_process() -> None:
    done = _mpiexec("-n", "2", sys.executable, WORKER, "mpi", "collectives", "training")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["ok", "collectives", "ok", "training"]


@needs_mpi
def test_a_rank_that_dies_fails_the_other_within_the_timeout() -> None:
    start = time.monotonic()
    done = _mpiexec("-disable-auto-cleanup", "-n", "2", sys.executable, WORKER, "mpi", "dead_rank",
                    timeout=60, env={"TEST_DIST_TIMEOUT": "2"})
    assert time.monotonic() - start < 40
    assert "all_reduce: rank 0 of 2 had no answer from the other ranks within 2 s" in done.stdout, done.stderr
    assert "ok dead_rank" in done.stdout and done.returncode != 0  # rank 1's exit status


@needs_mpi
def test_the_cli_trains_on_two_mpi_processes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "diffusion", "train", "--devices", "2", "--backend", "mpi",
                           "--steps", "4", "--batch-size", "8", "--channels", "8,16", "--warmup-steps", "1",
                           "--log-every", "2", "--per-class", "1", "--sample-steps", "2", "--digits", "0-1",
                           "--no-progress", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "TENSORCORE_BACKEND": "numpy"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("training a class-conditional") == 1 and "2 processes (mpi)" in done.stdout
    rows = (out / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows] == ["step", "2", "4"]
    assert (out / "samples.png").is_file() and (out / "pipeline").is_dir()
