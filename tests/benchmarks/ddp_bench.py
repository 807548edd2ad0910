"""Data parallel over N GPUs: all-reduce bus bandwidth and the reference UNet's training step,
tensorcore against PyTorch in the same run.

    python tests/benchmarks/ddp_bench.py                   # N = 1, 2, 4, 8 up to the GPUs there are
    python tests/benchmarks/ddp_bench.py --ranks 2,4 --markdown
    python tests/benchmarks/ddp_bench.py --device cpu --ranks 1,2 --size 16 --iters 2   # a CPU smoke run

For each table and each N the script starts itself as N ranks (``python -m
tensorcore.distributed.run``, ``--mpi`` on the CPU); rank 0 prints one JSON line per
measurement and this process prints the rows as they come.

* all-reduce: float32 sums of 1 MiB .. 1 GiB, ``tensorcore.distributed.all_reduce``
  (NCCL through CuPy) against ``torch.distributed.all_reduce`` (NCCL through PyTorch),
  each timed over ``--iters`` back-to-back calls with CUDA events; bus bandwidth as
  nccl-tests defines it, bytes / time x 2 (N - 1) / N.
* UNet training step: ``UNet2D.reference()`` at ``--batch`` per GPU on
  [4, ``--size``, ``--size``] inputs, MSE loss, AdamW, wrapped in DistributedDataParallel,
  the whole step ``tc.compile``d (one CUDA graph per step with the gradient all-reduces
  inside) against diffusers' ``UNet2DModel`` of the same config under
  ``torch.nn.parallel.DistributedDataParallel`` (eager, fused AdamW), both with TF32
  matmuls allowed (``--precision``).  Speed-up is samples/s at N over samples/s at 1
  (weak scaling: the batch per GPU stays); perfect is N.

On the CPU the same runs use the mpi backend against torch's gloo (a smoke test of the
script, not a benchmark).  Timings are printed, never asserted.
"""

from __future__ import annotations

import sys

sys.path.append(".gpu-vendor")  # diffusers on the GPU machine is vendored; appended so installed packages win

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import bench_report  # noqa: E402  (tests/benchmarks/bench_report.py)

SIZES_MIB = (1, 4, 16, 64, 256, 1024)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--ranks", default=None, help="comma-separated rank counts (default: 1,2,4,8 up to the GPUs)")
    parser.add_argument("--batch", type=int, default=8, help="UNet samples per rank (default: %(default)s)")
    parser.add_argument("--size", type=int, default=128, help="UNet input side (default: %(default)s)")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per measurement (default: %(default)s)")
    parser.add_argument("--precision", choices=("highest", "high"), default="high",
                        help="matmul precision of both sides; high allows TF32 (default: %(default)s)")
    parser.add_argument("--max-mib", type=int, default=1024, help="largest all-reduce, MiB (default: %(default)s)")
    parser.add_argument("--worker", choices=("all_reduce", "unet"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--torch-port", type=int, default=0, help=argparse.SUPPRESS)
    return bench_report.parse(parser)


# ----- one rank ---------------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    """Measure on this rank; rank 0 reports each figure as a JSON line."""
    gpu = args.device == "cuda"
    if gpu:
        os.environ.setdefault("TENSORCORE_BACKEND", "cupy")
    import tensorcore as tc
    import tensorcore.distributed as dist
    import torch
    import torch.distributed as torch_dist

    from tensorcore.distributed import environment

    dist.init("nccl" if gpu else "mpi")
    rank, world = dist.get_rank(), dist.get_world_size()
    if gpu:
        torch.cuda.set_device(environment.placement().local_rank)
    torch_dist.init_process_group("nccl" if gpu else "gloo", init_method=f"tcp://127.0.0.1:{args.torch_port}",
                                  rank=rank, world_size=world)
    tc.set_matmul_precision(args.precision)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.precision == "high"
    timers = Timers(gpu)

    def report(**row: Any) -> None:
        if rank == 0:
            print(json.dumps({"ranks": world, **row}), flush=True)

    if args.worker == "all_reduce":
        for mib in (m for m in SIZES_MIB if m <= args.max_mib):
            n = mib * 2**20 // 4
            ours, theirs = tc.ones(n, device=args.device), torch.ones(n, device=args.device)
            ours_ms = timers.ours(lambda: dist.all_reduce(ours), args.iters)
            theirs_ms = timers.torch(lambda: torch_dist.all_reduce(theirs), args.iters)
            report(mib=mib, ours_ms=ours_ms, torch_ms=theirs_ms)
    else:
        ours_ms = unet_step_ours(args, timers)
        if gpu:
            tc.cuda.empty_cache()  # room for the PyTorch model
        report(ours_ms=ours_ms, torch_ms=unet_step_torch(args, timers))
    torch_dist.destroy_process_group()
    dist.destroy()


class Timers:
    """Milliseconds per call of ``fn`` over ``iters`` back-to-back calls after a warm-up,
    with CUDA events on the GPU (CuPy's for tensorcore, torch's for PyTorch), else the clock."""

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu

    def ours(self, fn: Callable[[], Any], iters: int, warmup: int = 3) -> float:
        if not self.gpu:
            return self._clock(fn, iters, warmup)
        import cupy

        return self._events(fn, iters, warmup, cupy.cuda.Event, cupy.cuda.get_elapsed_time)

    def torch(self, fn: Callable[[], Any], iters: int, warmup: int = 3) -> float:
        if not self.gpu:
            return self._clock(fn, iters, warmup)
        import torch

        return self._events(fn, iters, warmup, lambda: torch.cuda.Event(enable_timing=True),
                            lambda a, b: a.elapsed_time(b))

    @staticmethod
    def _events(fn: Callable[[], Any], iters: int, warmup: int, event: Callable[[], Any],
                elapsed: Callable[[Any, Any], float]) -> float:
        for _ in range(warmup):
            fn()
        start, stop = event(), event()
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        return elapsed(start, stop) / iters

    @staticmethod
    def _clock(fn: Callable[[], Any], iters: int, warmup: int) -> float:
        for _ in range(warmup):
            fn()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) * 1e3 / iters


def unet_step_ours(args: argparse.Namespace, timers: Timers) -> float:
    """ms per compiled DDP training step of UNet2D.reference()."""
    import numpy as np

    import tensorcore as tc
    import tensorcore.distributed as dist
    import tensorcore.functional as F
    from diffusion import UNet2D
    from optim import AdamW

    unet = UNet2D.reference().train().to(args.device)
    dist.DistributedDataParallel(unet)
    optimizer = AdamW(unet.parameters(), lr=1e-4)
    x, noise, t = unet_inputs(args, np)
    x, noise, t = (tc.tensor(a, device=args.device) for a in (x, noise, t))

    def update(model: Any, x: Any, t: Any, noise: Any) -> Any:
        optimizer.zero_grad(set_to_none=False)
        loss = F.mse_loss(model(x, t), noise)
        loss.backward()
        optimizer.step()
        return loss.detach()

    step = tc.compile(update, cache_dir=False)
    ms = timers.ours(lambda: step(unet, x, t, noise), args.iters)
    step.release()
    return ms


def unet_step_torch(args: argparse.Namespace, timers: Timers) -> float:
    """ms per eager step of diffusers' UNet2DModel (same config) under torch DDP."""
    import numpy as np
    import torch
    from diffusers import UNet2DModel

    from diffusion import UNet2D

    config = UNet2D.reference().config
    model = UNet2DModel(**{k: config[k] for k in ("in_channels", "out_channels", "block_out_channels",
                                                  "down_block_types", "up_block_types", "layers_per_block",
                                                  "attention_head_dim", "norm_num_groups")}).to(args.device).train()
    gpu = args.device == "cuda"
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if gpu else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=gpu)
    x, noise, t = (torch.tensor(a, device=args.device) for a in unet_inputs(args, np))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x, t).sample, noise)
        loss.backward()
        optimizer.step()

    return timers.torch(step, args.iters)


def unet_inputs(args: argparse.Namespace, np: Any) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(0)
    shape = (args.batch, 4, args.size, args.size)
    return (rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32),
            rng.integers(0, 1000, args.batch))


# ----- the driver ------------------------------------------------------------------------------
def rank_counts(args: argparse.Namespace) -> list[int]:
    if args.ranks:
        return [int(n) for n in args.ranks.split(",")]
    if args.device == "cpu":
        return [1, 2]
    import cupy

    gpus = cupy.cuda.runtime.getDeviceCount()
    return [n for n in (1, 2, 4, 8) if n <= gpus]


def run_ranks(args: argparse.Namespace, part: str, n: int) -> list[dict]:
    """Start ``n`` ranks of this script measuring ``part``; rank 0's JSON lines."""
    from tensorcore.distributed.run import free_port

    here = os.path.abspath(__file__)
    passed = ["--device", args.device, "--batch", str(args.batch), "--size", str(args.size), "--iters",
              str(args.iters), "--precision", args.precision, "--max-mib", str(args.max_mib)]
    command = [sys.executable, "-m", "tensorcore.distributed.run", "--nproc-per-node", str(n),
               *(["--mpi"] if args.device == "cpu" else []), here, "--worker", part, "--torch-port", str(free_port()),
               *passed]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, cwd=bench_report.REPO)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0:
        bench_report.note(f"{part} on {n} ranks: exited with status {done.returncode} after {len(rows)} rows")
    return rows


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    device = bench_report.machine() if args.device == "cuda" else "CPU (mpi against gloo)"
    counts = rank_counts(args)
    table = bench_report.Table(f"all-reduce, float32 sum, bus bandwidth, {device}",
                               ["ranks", "MiB", "tensorcore GB/s", "torch GB/s", "ratio"])
    for n in (n for n in counts if n > 1):  # one rank moves nothing
        factor = 2 * (n - 1) / n
        for row in run_ranks(args, "all_reduce", n):
            ours, theirs = (row["mib"] * 2**20 / (row[k] * 1e-3) / 1e9 * factor for k in ("ours_ms", "torch_ms"))
            table.row(n, row["mib"], f"{ours:.1f}", f"{theirs:.1f}", f"{ours / theirs:.2f}")
    table = bench_report.Table(f"UNet2D.reference() train step, batch {args.batch} per rank, [4, {args.size}, "
                               f"{args.size}], AdamW, precision {args.precision}, {device}",
                               ["ranks", "tensorcore ms", "torch DDP ms", "ratio", "tensorcore speed-up",
                                "torch speed-up"])
    single: dict[str, float] = {}
    for n in counts:
        for row in run_ranks(args, "unet", n):
            if n == 1:
                single = {"ours": row["ours_ms"], "torch": row["torch_ms"]}
            speedups = [f"{n * single[k] / row[k + '_ms']:.2f}" if single else "-" for k in ("ours", "torch")]
            table.row(n, f"{row['ours_ms']:.1f}", f"{row['torch_ms']:.1f}", f"{row['ours_ms'] / row['torch_ms']:.2f}",
                      *speedups)


if __name__ == "__main__":
    main()
