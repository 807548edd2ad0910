"""Where the GPU time of a compiled UNet forward goes, kernel by kernel.

    TENSORCORE_BACKEND=cupy python tests/benchmarks/unet_kernels.py [tf32|bf16|fp32|fp16] [--order NAME]
    TENSORCORE_BACKEND=cupy python tests/benchmarks/unet_kernels.py fp16 --model sd15
    TENSORCORE_BACKEND=cupy python tests/benchmarks/unet_kernels.py fp16 --model vae --copies

The compiled ``UNet2D.reference()`` forward at [1, 4, 128, 128] (or with ``--model sd15``
the SD-1.5 ``UNet2DConditionModel`` on [2, 4, 64, 64] with text states [2, 77, 768], with
``--model vae`` the SD VAE decode of [1, 4, 64, 64] latents to 512² images) is replayed ten times
under ``torch.profiler`` with CUDA activity on: CUPTI records every kernel the process
runs, those inside our CUDA graphs included, with its device time.  Prints the kernel
time per forward, then the kernels by total time (calls per forward, ms per forward);
``--order NAME`` also lists, in launch order, the time of each launch of the kernels whose
name contains NAME in the first forward (e.g. ``--order conv_pack`` for the convolution
packs, one per 3x3 convolution).  ``--copies`` also counts, in one eager forward, the layout
copies CuPy makes (``ascontiguousarray``, ``copy``, ``copyto``, ``concatenate``) by the
backend method and the model line that asked for them.  Needs PyTorch with CUDA next to CuPy (the GPU machine
has both); nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import traceback
from typing import Any

import bench_report  # tests/benchmarks/bench_report.py
from sd_bench import SD15_UNET, SD15_VAE  # tests/benchmarks/sd_bench.py

REPLAYS = 10


def build(precision: str, model: str) -> tuple[Any, Any, tuple]:
    """The model's eager forward, its compiled forward and their arguments, on the GPU in
    ``precision``."""
    import tensorcore as tc
    from diffusion import AutoencoderKL, UNet2D, UNet2DConditionModel

    tc.set_matmul_precision("highest" if precision == "fp32" else "high")
    tc.manual_seed(0)
    if model == "vae":
        module = AutoencoderKL(**SD15_VAE)
        args = (tc.randn(1, 4, 64, 64, device="cuda"),)
    elif model == "sd15":
        module = UNet2DConditionModel(**SD15_UNET)
        args = (tc.randn(2, 4, 64, 64, device="cuda"), tc.tensor([500.0], device="cuda"),
                tc.randn(2, 77, 768, device="cuda"))
    else:
        module = UNet2D.reference()
        args = (tc.randn(1, 4, 128, 128, device="cuda"), tc.tensor([500.0], device="cuda"))
    module.to("cuda").eval()
    half = {"bf16": tc.bfloat16, "fp16": tc.float16}.get(precision)
    if half is not None:
        module.to(dtype=half)
        args = tuple(a if a.ndim == 1 else a.to(dtype=half) for a in args)
    if model == "vae":
        return module.decode, module.compiled("decode"), args
    return module, tc.compile(module, cache_dir=False), args


def profile(precision: str, model: str) -> list[Any]:
    """The CUDA kernel events of REPLAYS compiled forwards in ``precision``."""
    import cupy as cp
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    import tensorcore as tc

    _, compiled, args = build(precision, model)
    with tc.no_grad():
        for _ in range(5):  # trace, capture, settle
            compiled(*args)
        cp.cuda.Device().synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(REPLAYS):
                compiled(*args)
            cp.cuda.Device().synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def copy_sites(precision: str, model: str) -> collections.Counter:
    """How many layout copies one eager forward makes, by (backend method, model line)."""
    import cupy as cp

    import tensorcore as tc
    from tensorcore.backends.cupy import util

    eager, _, args = build(precision, model)
    sites: collections.Counter = collections.Counter()

    def counted(fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            frames = traceback.extract_stack()[:-1]
            ours = [f for f in frames if "/tensorcore/backends/" in f.filename]
            model_lines = [f for f in frames if "/diffusion/" in f.filename or "/layers/" in f.filename]
            method = ours[0].name if ours else "?"
            line = (f"{model_lines[-1].filename.rsplit('/', 1)[-1]}:{model_lines[-1].lineno} "
                    f"{model_lines[-1].line}" if model_lines else "?")
            sites[(method, fn.__name__, line[:90])] += 1
            return fn(*a, **k)
        return wrapper

    patched = [(cp, "ascontiguousarray"), (cp, "copyto"), (cp, "concatenate"), (util.cupy, "ascontiguousarray")]
    saved = [(mod, name, getattr(mod, name)) for mod, name in patched]
    with tc.no_grad():
        eager(*args)  # warm: plans and workspaces made once
        try:
            for mod, name, fn in saved:
                setattr(mod, name, counted(fn))
            eager(*args)
        finally:
            for mod, name, fn in saved:
                setattr(mod, name, fn)
    return sites


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("precision", nargs="?", choices=("tf32", "bf16", "fp32", "fp16"), default="tf32")
    parser.add_argument("--model", choices=("reference", "sd15", "vae"), default="reference")
    parser.add_argument("--copies", action="store_true", help="count one eager forward's layout copies by site")
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
    if args.copies:
        sites = copy_sites(precision, args.model)
        table = bench_report.Table(f"layout copies in one eager forward: {sum(sites.values())}",
                                   ["copies", "backend method", "CuPy call", "model line"])
        for (method, call, line), n in sites.most_common(30):
            table.row(n, method, call, line)


if __name__ == "__main__":
    main()
