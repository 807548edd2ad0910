"""Reference UNet forward: tensorcore's UNet2D against diffusers' UNet2DModel (PyTorch eager),
same config, same weights, same input, in one run.

    PYTHONPATH=. python3 tests/benchmarks/unet_bench.py                 # GPU when CuPy is installed
    PYTHONPATH=. python3 tests/benchmarks/unet_bench.py --device cpu    # CPU, [1, 4, 32, 32]

The network is ``UNet2D.reference()`` (57.6 M parameters); the input [1, 4, 128, 128] on the
GPU, [1, 4, 32, 32] on the CPU (``--size``).  Both models run eager in float32 without
gradients, first with exact float32 matmuls ("highest"), then with TF32 allowed ("high":
``tc.set_matmul_precision("high")`` and torch's ``allow_tf32``).  Each row prints the median
forward time of both, their ratio and the largest absolute difference of the outputs.
On the GPU, times come from CUDA events around each call (so host overhead that starves
the GPU counts); on the CPU from the wall clock.  Timings are printed, never asserted.
"""

from __future__ import annotations

import sys

sys.path.append(".gpu-vendor")  # diffusers on the GPU machine is vendored; appended so installed packages win

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import bench_report  # noqa: E402  (tests/benchmarks/bench_report.py)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"),
                        default="cuda" if importlib.util.find_spec("cupy") else "cpu")
    parser.add_argument("--size", type=int, default=None, help="latent side (default 128 on cuda, 32 on cpu)")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per row (default 30 on cuda, 5 on cpu)")
    parser.add_argument("--seed", type=int, default=0)
    return bench_report.parse(parser)


def median_ms(fn: Callable[[], Any], iters: int, timer: Callable[[Callable[[], Any]], float]) -> float:
    for _ in range(3):
        fn()
    return statistics.median(timer(fn) for _ in range(iters))


def wall_timer(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def cupy_timer(fn: Callable[[], Any]) -> float:
    import cupy as cp

    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop)


def torch_timer(fn: Callable[[], Any]) -> float:
    import torch

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop)


def main() -> None:
    args = parse_args()
    if args.device == "cuda":
        os.environ.setdefault("TENSORCORE_BACKEND", "cupy")
    import numpy as np

    import tensorcore as tc  # before torch, so the CPU thread settings apply
    from diffusion import UNet2D

    import torch
    from diffusers import UNet2DModel

    size = args.size or (128 if args.device == "cuda" else 32)
    iters = args.iters or (30 if args.device == "cuda" else 5)
    torch.manual_seed(args.seed)
    reference = UNet2D.reference()
    theirs = UNet2DModel(**{k: reference.config[k] for k in ("in_channels", "out_channels", "block_out_channels",
                                                           "down_block_types", "up_block_types", "layers_per_block",
                                                           "attention_head_dim", "norm_num_groups")})
    theirs = theirs.eval().to(args.device)
    ours = reference.eval()
    ours.load_state_dict({k: v.detach().cpu().numpy() for k, v in theirs.state_dict().items()})
    ours.to(args.device)

    x = np.random.default_rng(args.seed).standard_normal((1, 4, size, size)).astype(np.float32)
    x_ours, t_ours = tc.tensor(x, device=args.device), tc.tensor([500], device=args.device)
    x_theirs, t_theirs = torch.tensor(x, device=args.device), torch.tensor([500], device=args.device)

    def run_ours() -> Any:
        with tc.no_grad():
            return ours(x_ours, t_ours)

    def run_theirs() -> Any:
        with torch.inference_mode():
            return theirs(x_theirs, t_theirs).sample

    gpu = args.device == "cuda"
    name = torch.cuda.get_device_name() if gpu else f"CPU, {torch.get_num_threads()} torch threads"
    table = bench_report.Table(f"reference UNet forward [1, 4, {size}, {size}] float32, eager, no grad, "
                               f"{args.device} ({name})",
                               ["matmul precision", "tensorcore ms", "torch ms", "ratio", "max |diff|", "max |out|"],
                               first=18)
    for precision in ("highest", "high"):
        tc.set_matmul_precision(precision)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "high"
        ours_ms = median_ms(run_ours, iters, cupy_timer if gpu else wall_timer)
        theirs_ms = median_ms(run_theirs, iters, torch_timer if gpu else wall_timer)
        expected = run_theirs().float().cpu().numpy()
        diff = float(np.abs(run_ours().numpy() - expected).max())
        label = "high (TF32)" if precision == "high" else precision
        table.row(label, f"{ours_ms:.2f}", f"{theirs_ms:.2f}", f"{ours_ms / theirs_ms:.2f}", f"{diff:.2e}",
                  f"{float(np.abs(expected).max()):.3f}")


if __name__ == "__main__":
    main()
