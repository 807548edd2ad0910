"""Where the GPU time of a compiled UNet forward goes, kernel by kernel.

    TENSORCORE_BACKEND=cupy python tests/benchmarks/unet_kernels.py [tf32|bf16|fp32|fp16] [--order NAME]
    TENSORCORE_BACKEND=cupy python tests/benchmarks/unet_kernels.py fp16 --model sd15

The compiled ``UNet2D.reference()`` forward at [1, 4, 128, 128] (or with ``--model sd15``
the SD-1.5 ``UNet2DConditionModel`` on [2, 4, 64, 64] with text states [2, 77, 768]) is
replayed ten times
under ``torch.profiler`` with CUDA activity on: CUPTI records every kernel the process
runs, those inside our CUDA graphs included, with its device time.  Prints the kernel
time per forward, then the kernels by total time (calls per forward, ms per forward);
``--order NAME`` also lists, in launch order, the time of each launch of the kernels whose
name contains NAME in the first forward (e.g. ``--order conv_pack`` for the convolution
packs, one per 3x3 convolution).  Needs PyTorch with CUDA next to CuPy (the GPU machine
has both); nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

import bench_report  # tests/benchmarks/bench_report.py

REPLAYS = 10


def profile(precision: str, model: str) -> list[Any]:
    """The CUDA kernel events of REPLAYS compiled forwards in ``precision``."""
    import cupy as cp
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    import tensorcore as tc
    from diffusion import UNet2D, UNet2DConditionModel

    tc.set_matmul_precision("highest" if precision == "fp32" else "high")
    tc.manual_seed(0)
    if model == "sd15":
        unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768, attention_head_dim=8).to("cuda").eval()
        args = (tc.randn(2, 4, 64, 64, device="cuda"), tc.tensor([500.0], device="cuda"),
                tc.randn(2, 77, 768, device="cuda"))
    else:
        unet = UNet2D.reference().to("cuda").eval()
        args = (tc.randn(1, 4, 128, 128, device="cuda"), tc.tensor([500.0], device="cuda"))
    half = {"bf16": tc.bfloat16, "fp16": tc.float16}.get(precision)
    if half is not None:
        unet.to(dtype=half)
        args = tuple(a if a.ndim == 1 else a.to(dtype=half) for a in args)
    compiled = tc.compile(unet, cache_dir=False)
    with tc.no_grad():
        for _ in range(5):  # trace, capture, settle
            compiled(*args)
        cp.cuda.Device().synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(REPLAYS):
                compiled(*args)
            cp.cuda.Device().synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("precision", nargs="?", choices=("tf32", "bf16", "fp32", "fp16"), default="tf32")
    parser.add_argument("--model", choices=("reference", "sd15"), default="reference")
    parser.add_argument("--order", metavar="NAME", help="list each launch of the kernels whose name contains NAME")
    args = bench_report.parse(parser)
    precision, order = args.precision, args.order
    events = profile(precision, args.model)
    total_us, calls = collections.Counter(), collections.Counter()
    for e in events:
        total_us[e.name] += e.device_time_total
        calls[e.name] += 1
    table = bench_report.Table(f"{precision}: kernel time per forward {sum(total_us.values()) / REPLAYS / 1e3:.3f} ms, "
                               f"{sum(calls.values()) // REPLAYS} kernels per forward",
                               ["ms per forward", "calls per forward", "kernel"])
    for name, us in total_us.most_common(40):
        table.row(f"{us / REPLAYS / 1e3:.4f}", calls[name] // REPLAYS, name[:100])
    if order:
        chosen = [e for e in events if order in e.name]
        first = chosen[:len(chosen) // REPLAYS]
        bench_report.note(f"{order}, each launch of the first forward in order (us): "
              + " ".join(f"{e.device_time_total:.1f}" for e in first))


if __name__ == "__main__":
    main()
