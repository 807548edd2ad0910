"""One rank of the distributed tests, run as a script by them:

    mpiexec -n 2 python tests/distributed_worker.py mpi collectives training
    python -m tensorcore.distributed.run --nproc-per-node 2 tests/distributed_worker.py nccl collectives training
    mpiexec -n 2 -disable-auto-cleanup python tests/distributed_worker.py mpi dead_rank

Each rank checks its own results (an assertion fails the process, and so the job);
rank 0 prints ``ok <case>`` after each case.  ``check_collectives`` and
``check_training`` are also imported by the one-GPU tests, which run them as a
single rank.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

import tensorcore as tc
import tensorcore.distributed as dist
import tensorcore.functional as F
from optim import AdamW
from pipeline_helpers import NUM_CLASSES, tiny_unet

DEVICES = {"mpi": "cpu", "nccl": "cuda"}
PER_RANK = 4  # samples of each global batch per rank (two halves under no_sync)
STEPS = 4  # a compiled step traces (at most twice, while the optimizer packs its buffers), then replays
# AdamW with eps=1e-6: the convolution biases ahead of a GroupNorm have an exact gradient of
# zero, so what backward computes for them is rounding noise (~1e-9) that differs with the
# batch split, and eps=1e-8 would turn it into full-size steps of lr.
ADAM = dict(lr=1e-3, eps=1e-6)
TOLERANCE = 5e-6  # on parameters of size ~0.1-1 after four steps of 1e-3


# ----- collectives against NumPy ------------------------------------------------------------
def rank_values(rank: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """What rank ``rank`` contributes: small integers, exact in every dtype tested."""
    values = np.random.default_rng(rank).integers(-8, 9, size=shape)
    return values.astype(tc.bfloat16 if dtype == "bfloat16" else dtype)


def check_collectives(device: str) -> None:
    """Every collective on every dtype equals NumPy's answer over all ranks' inputs."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dtypes = ["float16", "float32", "float64", "int64"] + (["bfloat16"] if device == "cuda" else [])
    shape = (3, 5)
    for dtype in dtypes:
        inputs = np.stack([rank_values(r, dtype, shape).astype(np.float64) for r in range(world)])
        mine = rank_values(rank, dtype, shape)
        floating = dtype != "int64"
        for op, expected in (("sum", inputs.sum(0)), ("max", inputs.max(0)), ("avg", inputs.mean(0))):
            if op == "avg" and not floating:
                continue
            t = tc.tensor(mine, device=device)
            dist.all_reduce(t, op)
            close(t, expected, f"all_reduce {op} {dtype}")
            scattered = tc.zeros(*shape, dtype=t.dtype, device=device)
            stacked = np.stack([rank_values(r, dtype, (world, *shape)) for r in range(world)]).astype(np.float64)
            reduced = {"sum": stacked.sum(0), "max": stacked.max(0), "avg": stacked.mean(0)}[op]
            dist.reduce_scatter(scattered, tc.tensor(rank_values(rank, dtype, (world, *shape)), device=device), op)
            close(scattered, reduced[rank], f"reduce_scatter {op} {dtype}")
        t = tc.tensor(mine, device=device)
        dist.broadcast(t, src=world - 1)
        close(t, inputs[world - 1], f"broadcast {dtype}")
        gathered = tc.zeros(world * shape[0], shape[1], dtype=t.dtype, device=device)
        dist.all_gather(gathered, tc.tensor(mine, device=device))
        close(gathered, inputs.reshape(world * shape[0], shape[1]), f"all_gather {dtype}")
        parts = [tc.zeros(*shape, dtype=t.dtype, device=device) for _ in range(world)]
        dist.all_gather(parts, tc.tensor(mine, device=device))
        for r, part in enumerate(parts):
            close(part, inputs[r], f"all_gather into a list {dtype}")
    dist.barrier()


def close(t: tc.Tensor, expected: np.ndarray, what: str) -> None:
    got = t.float().numpy().astype(np.float64)
    assert np.allclose(got, expected, rtol=1e-2, atol=1e-2), f"{what}: got {got}, expected {expected}"


# ----- data-parallel training against one process ---------------------------------------------
def global_batches(device: str, size: int) -> list[tuple[tc.Tensor, ...]]:
    """``STEPS`` fixed batches of ``size`` (noisy digit-like images, timesteps, labels, noise)."""
    rng = np.random.default_rng(42)
    batches = []
    for _ in range(STEPS):
        x0 = rng.uniform(-1, 1, (size, 1, 8, 8)).astype(np.float32)
        noise = rng.standard_normal((size, 1, 8, 8)).astype(np.float32)
        t = rng.integers(0, 1000, size)
        labels = rng.integers(0, NUM_CLASSES, size)
        batches.append(tuple(tc.tensor(a, device=device) for a in (x0 + 0.5 * noise, t, labels, noise)))
    return batches


def shard(batch: tuple[tc.Tensor, ...], rank: int, world: int) -> tuple[tc.Tensor, ...]:
    index = tc.tensor(np.arange(rank, batch[0].shape[0], world), device=batch[0].device)
    return tuple(t[index] for t in batch)


def loss_of(unet: Any, batch: tuple[tc.Tensor, ...]) -> tc.Tensor:
    noisy, t, labels, noise = batch
    return F.mse_loss(unet(noisy, t, class_labels=labels), noise)


def train(unet: Any, optimizer: AdamW, batches: list[tuple[tc.Tensor, ...]],
          compiled: bool = False) -> list[np.ndarray]:
    """``STEPS`` steps, each one ``tc.compile``d call when ``compiled``; the final parameters."""
    def update(model: Any, *batch: tc.Tensor) -> tc.Tensor:
        optimizer.zero_grad(set_to_none=False)
        loss = loss_of(model, batch)
        loss.backward()
        optimizer.step()
        return loss.detach()

    step = tc.compile(update) if compiled else update
    for batch in batches:
        step(unet, *batch)
    if compiled:
        check_replayed_collectives(step)
    return [p.numpy() for p in unet.parameters()]


def check_replayed_collectives(step: Any) -> None:
    """The compiled step replayed its plan (a CUDA graph on the GPU), and the plan holds the
    gradient all-reduces and their wait."""
    info = step.cache_info()
    assert info.hits >= 1 and info.fallbacks == 0 and info.eager_only == 0, info
    graph = step.plan_info()[0]["graph"]
    assert "collective_(" in graph and "'all_reduce'" in graph and "'wait'" in graph, graph


def fresh_unet(device: str, seed: int) -> Any:
    return tiny_unet(seed=seed).train().to(device)


def check_training(device: str) -> None:
    """Each rank trains on its shard of every global batch; the parameters equal one
    process trained on the whole batches, for plain DDP, DDP with sharded optimizer state,
    DDP inside a compiled step, and gradient accumulation under ``no_sync``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = global_batches(device, PER_RANK * world)
    reference_unet = fresh_unet(device, seed=0)
    reference = train(reference_unet, AdamW(reference_unet.parameters(), **ADAM), batches)
    mine = [shard(b, rank, world) for b in batches]

    def data_parallel(shard_state: bool = False) -> tuple[Any, Any, AdamW]:
        unet = fresh_unet(device, seed=rank)  # other weights on the other ranks: the wrap broadcasts rank 0's
        model = dist.DistributedDataParallel(unet, bucket_mb=0.05)  # several buckets
        optimizer = AdamW(unet.parameters(), **ADAM)
        return unet, model, optimizer.shard_state() if shard_state else optimizer

    for name, shard_state, compiled in (("ddp", False, False), ("zero1", True, False), ("compiled", False, True)):
        unet, _, optimizer = data_parallel(shard_state)  # backward through the module itself is averaged too
        check_close(name, train(unet, optimizer, mine, compiled), reference)
    unet, model, optimizer = data_parallel()
    for batch in mine:  # two half micro-batches per step, averaged once
        optimizer.zero_grad(set_to_none=False)
        with model.no_sync():
            (0.5 * loss_of(model, _half(batch, 0))).backward()
        (0.5 * loss_of(model, _half(batch, 1))).backward()
        optimizer.step()
    check_close("no_sync", [p.numpy() for p in unet.parameters()], reference)


def _half(batch: tuple[tc.Tensor, ...], i: int) -> tuple[tc.Tensor, ...]:
    size = batch[0].shape[0] // 2
    return tuple(t[i * size:(i + 1) * size] for t in batch)


def check_close(name: str, params: list[np.ndarray], reference: list[np.ndarray]) -> None:
    worst = max(float(np.abs(a - b).max()) for a, b in zip(params, reference))
    assert worst < TOLERANCE, f"{name}: parameters differ from one process on the global batch by {worst}"


# ----- a rank that dies ----------------------------------------------------------------------
def check_dead_rank(device: str) -> None:
    """Rank 1 exits; rank 0's next collective fails within the timeout, naming it."""
    if dist.get_rank() == 1:
        os._exit(7)
    start = time.monotonic()
    try:
        dist.all_reduce(tc.ones(4, device=device))
    except RuntimeError as exc:
        print(f"rank 0 failed after {time.monotonic() - start:.1f} s: {exc}", flush=True)
        return
    raise AssertionError("all_reduce returned although rank 1 had died")


CASES = {"collectives": check_collectives, "training": check_training, "dead_rank": check_dead_rank}


def main(argv: list[str]) -> None:
    backend, cases = argv[0], argv[1:]
    dist.init(backend, timeout=float(os.environ.get("TEST_DIST_TIMEOUT", "60")))
    for case in cases:
        CASES[case](DEVICES[backend])
        if dist.get_rank() == 0:
            print(f"ok {case}", flush=True)
    dist.destroy()


if __name__ == "__main__":
    main(sys.argv[1:])
