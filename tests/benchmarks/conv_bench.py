"""Every distinct convolution of the reference UNet: tensorcore's implicit-GEMM kernels
next to PyTorch (cuDNN), in one run.

    PYTHONPATH=. python3 tests/benchmarks/conv_bench.py [--quick] [--tiles]

The UNet is ../shared/bench/REFERENCE_UNET.md's (base 128, multipliers 1, 2, 4, two
ResBlocks per level, input [B, 4, 128, 128]); its convolutions are enumerated from that
description with how often each runs in one forward.  Each is timed at batch 1 and 8,
forward and forward + backward (input and weight gradient), in TF32 and bfloat16.
Both libraries are timed as replayed CUDA graphs (median of CUDA-event timings after
warm-up, random inputs), so host launch costs are out of both figures; cuDNN runs with
``cudnn.benchmark`` on (its best algorithm per shape).  TFLOP/s counts 2 * N * Ho * Wo *
Cout * Cin * kh * kw per pass (three passes for forward + backward); "peak" is the
fraction of the H200's dense tensor-core rate (TF32 494.7, bf16 989.4 TFLOP/s).  The
last lines sum the forward convolutions of one UNet forward, each times its count.
``--tiles`` also times every tile of the kernels on the target shapes (a "g" marks the
forward's warpgroup-MMA tiles, the default on sm_90).  ``--model sd15`` or ``--model vae``
times instead, in float16, the forward convolutions of the SD-1.5 UNet at batch 2 (the
same structure: base 320, multipliers 1, 2, 4, 4, 64² latents) or of the SD VAE decoder
(512² images) as the models run them: ours with channels-last weights read in place and
NCHW activations packed by the kernels, cuDNN on channels-last tensors (what
``torch.compile`` gives it); there ``--tiles`` times the five heaviest convolutions on
every forward tile (and the first two with one tile more copied ahead:
``Tile.lookahead``, "a" in the labels; every warpgroup-MMA tile with a copying
warpgroup of its own, "a0", the 128 x 128 one also with 6 stages), each with K walked
both ways (``Plan.taps_inner``).  No timing is asserted.

    PYTHONPATH=. python3 tests/benchmarks/conv_bench.py --model vae
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter
from dataclasses import dataclass

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F

import gpu_timing  # tests/benchmarks/gpu_timing.py
import tensorcore as tc
from tensorcore import settings
from tensorcore.backends.cupy import conv_halo, conv_plan
from tensorcore.backends.cupy.backend import CupyBackend
import bench_report  # tests/benchmarks/bench_report.py
from gpu_timing import graph_ms  # tests/benchmarks/gpu_timing.py

GPU = CupyBackend()
PEAK = {"tf32": 494.7e12, "bf16": 989.4e12}


@dataclass(frozen=True)
class Conv:
    cin: int
    cout: int
    kernel: int
    stride: int
    size: int  # input height = width

    @property
    def out(self) -> int:
        return (self.size + 2 * (self.kernel // 2) - self.kernel) // self.stride + 1

    def flops(self, batch: int) -> float:
        return 2.0 * batch * self.out ** 2 * self.cout * self.cin * self.kernel ** 2

    def label(self) -> str:
        s = f"{self.cin}->{self.cout} {self.kernel}x{self.kernel}"
        return s + (f" s{self.stride}" if self.stride > 1 else "") + f" @{self.size}"


def resblock(convs: Counter, cin: int, cout: int, hw: int) -> None:
    """Count a ResBlock's convolutions: two 3x3 and a 1x1 shortcut where channels change."""
    convs[Conv(cin, cout, 3, 1, hw)] += 1
    convs[Conv(cout, cout, 3, 1, hw)] += 1
    if cin != cout:
        convs[Conv(cin, cout, 1, 1, hw)] += 1


def unet_convs(base: int = 128, mults: tuple = (1, 2, 4), blocks: int = 2, size: int = 128,
               in_channels: int = 4) -> Counter:
    """Each convolution of one reference-UNet forward, with how often it runs (SD-1.5's
    UNet has the same structure: base 320, multipliers 1, 2, 4, 4, size 64)."""
    convs: Counter = Counter()
    ch, hw = base, size
    convs[Conv(in_channels, base, 3, 1, hw)] += 1  # conv_in
    skips = [ch]
    for level, mult in enumerate(mults):
        for _ in range(blocks):
            resblock(convs, ch, base * mult, hw)
            ch = base * mult
            skips.append(ch)
        if level < len(mults) - 1:  # stride-2 downsample
            convs[Conv(ch, ch, 3, 2, hw)] += 1
            hw //= 2
            skips.append(ch)
    resblock(convs, ch, ch, hw)  # middle (the attention block has no convolution)
    resblock(convs, ch, ch, hw)
    for level, mult in reversed(list(enumerate(mults))):
        for _ in range(blocks + 1):
            resblock(convs, ch + skips.pop(), base * mult, hw)
            ch = base * mult
        if level > 0:  # nearest x2 upsample, then a 3x3 convolution
            hw *= 2
            convs[Conv(ch, ch, 3, 1, hw)] += 1
    convs[Conv(base, in_channels, 3, 1, hw)] += 1  # conv_out
    return convs


def vae_decoder_convs() -> Counter:
    """Each convolution of one SD VAE decode of [1, 4, 64, 64] latents to 512² images."""
    convs: Counter = Counter({Conv(4, 4, 1, 1, 64): 1, Conv(4, 512, 3, 1, 64): 1})  # post_quant, conv_in
    resblock(convs, 512, 512, 64)  # middle
    resblock(convs, 512, 512, 64)
    ch, hw = 512, 64
    for level, cout in enumerate((512, 512, 256, 128)):
        for _ in range(3):
            resblock(convs, ch, cout, hw)
            ch = cout
        if level < 3:  # nearest x2 upsample, then a 3x3 convolution
            hw *= 2
            convs[Conv(ch, ch, 3, 1, hw)] += 1
    convs[Conv(128, 3, 3, 1, 512)] += 1  # conv_out
    return convs


def model_table(model: str, tiles: bool = False) -> None:
    """The float16 forward convolutions of the SD-1.5 UNet (batch 2) or the VAE decoder
    (batch 1), each against cuDNN on channels-last tensors, and their sum per forward;
    with ``tiles``, every forward tile (unsplit) timed on the five with the most FLOPs."""
    convs, batch = (unet_convs(base=320, mults=(1, 2, 4, 4), size=64), 2) if model == "sd15" \
        else (vae_decoder_convs(), 1)
    if model == "sd15":  # the transformers' proj_in and proj_out: 1x1 convolutions
        for channels, hw, transformers in ((320, 64, 5), (640, 32, 5), (1280, 16, 5), (1280, 8, 1)):
            convs[Conv(channels, channels, 1, 1, hw)] += 2 * transformers
    columns = ["conv", "count", "tc ms", "torch ms", "speed", "tc TF/s", "torch TF/s", "plan"]
    table = bench_report.Table(f"{model} forward convolutions, float16, batch {batch} "
                               "(speed = torch ms / tc ms)", columns, first=24)
    ours_sum = theirs_sum = 0.0
    for conv, count in sorted(convs.items(), key=lambda kv: -kv[0].flops(batch) * kv[1]):
        x = cp.random.standard_normal((batch, conv.cin, conv.size, conv.size), dtype=np.float32).astype(np.float16)
        w = cp.random.standard_normal((conv.cout, conv.cin, conv.kernel, conv.kernel), dtype=np.float32)
        w = cp.ascontiguousarray(w.astype(np.float16).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        tx, tw = (torch.from_dlpack(a).contiguous(memory_format=torch.channels_last) for a in (x, w))
        pad = conv.kernel // 2
        ms = graph_ms(lambda: GPU.conv2d(x, w, (conv.stride,) * 2, (pad, pad), (1, 1), 1))
        halo = conv_halo.covers(conv.cout, (conv.kernel,) * 2, (conv.stride,) * 2, (1, 1), "float16", False)
        plan = None if halo else conv_plan.last.get(conv_plan.FPROP)
        tms = torch_graph_ms(lambda: F.conv2d(tx, tw, stride=conv.stride, padding=pad))
        ours_sum, theirs_sum = ours_sum + count * ms, theirs_sum + count * tms
        flops = conv.flops(batch)
        table.row(conv.label(), count, f"{ms:.4f}", f"{tms:.4f}", f"{tms / ms:.2f}",
                  f"{flops / ms / 1e9:.0f}", f"{flops / tms / 1e9:.0f}",
                  f"{plan.tile.bm}x{plan.tile.bn}{'g' if plan.tile.wgmma else ''}/{plan.splits}" if plan
                  else "halo" if halo else "-")
    table = bench_report.Table(f"{model}: the forward's convolutions, each times its count",
                               ["tensorcore ms", "torch ms", "speed"])
    table.row(f"{ours_sum:.3f}", f"{theirs_sum:.3f}", f"{theirs_sum / ours_sum:.2f}")
    if tiles:
        heaviest = sorted(convs.items(), key=lambda kv: -kv[0].flops(batch) * kv[1])[:5]
        sweep = bench_report.Table(f"{model}: forward tiles, unsplit (ms; K with the taps inside each channel "
                                   "block / every channel of a tap in turn)", ["conv", "tile: ms"])
        candidates = conv_plan.tiles(conv_plan.FPROP, conv_plan.PREC_16, True)
        wgmma = tuple(t for t in candidates if t.wgmma)
        candidates += tuple(dataclasses.replace(t, lookahead=t.stages - 1) for t in wgmma[:2])
        candidates += tuple(dataclasses.replace(t, lookahead=0) for t in wgmma)
        candidates += tuple(dataclasses.replace(t, lookahead=0, stages=6) for t in wgmma if t.bm == t.bn == 128)
        for conv, _ in heaviest:
            x = cp.random.standard_normal((batch, conv.cin, conv.size, conv.size), dtype=np.float32).astype(np.float16)
            w = cp.random.standard_normal((conv.cout, conv.cin, conv.kernel, conv.kernel), dtype=np.float32)
            w = cp.ascontiguousarray(w.astype(np.float16).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
            geo = ((conv.stride,) * 2, (conv.kernel // 2,) * 2, (1, 1), 1)
            cells = []
            for tile in candidates:
                times = []
                for taps_inner in (True, False):
                    plan = conv_plan.Plan(tile, 1, taps_inner)
                    with conv_plan.forced(conv_plan.FPROP, plan):
                        times.append(graph_ms(lambda: GPU.conv2d(x, w, *geo), 15))
                ahead = f" a{tile.ahead}" if tile.wgmma else ""
                cells.append(f"{tile.bm}x{tile.bn}{'g' if tile.wgmma else ''} s{tile.stages}{ahead}: "
                             f"{times[0]:.4f}/{times[1]:.4f}")
            sweep.row(conv.label(), "  ".join(cells))


def torch_graph_ms(fn, iters: int = 30) -> float:
    """Median ms of replaying a torch CUDA graph of ``fn``."""
    replay, kept = gpu_timing.torch_graph(fn)
    for _ in range(3):
        replay()
    ms = gpu_timing.event_ms(replay, iters, warmup=0)
    del kept
    return ms


def operands(conv: Conv, batch: int, dtype: str):
    """(x, w, grad) as CuPy arrays and the same values as torch tensors."""
    shapes = ((batch, conv.cin, conv.size, conv.size), (conv.cout, conv.cin, conv.kernel, conv.kernel),
              (batch, conv.cout, conv.out, conv.out))
    arrays = [cp.random.standard_normal(s, dtype=np.float32) for s in shapes]
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    tensors = [torch.from_dlpack(a.copy()).to(tdtype) for a in arrays]
    if dtype == "bf16":
        arrays = [a.astype(tc.bfloat16) for a in arrays]
    return arrays, tensors


def time_conv(conv: Conv, batch: int, dtype: str, backward: bool) -> tuple[float, float, str]:
    """(tensorcore ms, torch ms, the plan tensorcore ran) for one case."""
    (x, w, g), (tx, tw, tg) = operands(conv, batch, dtype)
    pad = conv.kernel // 2
    geo = ((conv.stride,) * 2, (pad, pad), (1, 1), 1)

    def ours():
        y = GPU.conv2d(x, w, *geo)
        if not backward:
            return y
        return y, GPU.conv2d_grad_input(g, w, x.shape, *geo), GPU.conv2d_grad_weight(g, x, w.shape, *geo)

    def theirs():
        y = F.conv2d(tx, tw, stride=conv.stride, padding=pad)
        if not backward:
            return y
        return y, torch.ops.aten.convolution_backward(
            tg, tx, tw, None, [conv.stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1,
            [True, True, False])

    ms = graph_ms(ours)
    plan = conv_plan.last.get(conv_plan.FPROP)
    label = f"{plan.tile.bm}x{plan.tile.bn}{'g' if plan.tile.wgmma else ''}/{plan.splits}" \
        if plan else "-"
    if backward:
        wplan = conv_plan.last.get(conv_plan.WGRAD)
        label += f" w{wplan.tile.bm}x{wplan.tile.bn}/{wplan.splits}" if wplan else ""
    return ms, torch_graph_ms(theirs), label


def allow_tf32() -> None:
    """float32 convolutions in TF32 on both sides (bfloat16 ignores the setting)."""
    settings.set_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="batch 8 [128,64,64] cases only")
    parser.add_argument("--tiles", action="store_true", help="also time every tile on targets")
    parser.add_argument("--model", choices=("sd15", "vae"), help="a Stable Diffusion model's convolutions, float16")
    args = bench_report.parse(parser)
    torch.backends.cudnn.benchmark = True
    allow_tf32()
    if args.model:
        model_table(args.model, args.tiles)
        return
    convs = unet_convs()
    target = Conv(128, 128, 3, 1, 64)  # [8,128,64,64] -> 128, timed at batch 8 below
    cases = [target] if args.quick else list(convs) + [target]
    columns = ["conv", "B", "pass", "dtype", "tc ms", "torch ms", "speed", "tc TF/s", "peak", "torch TF/s", "plan"]
    table = bench_report.Table("Every convolution (speed = torch ms / tc ms)", columns, first=24)
    forward_sum: dict[str, list[float]] = {"tf32": [0.0, 0.0], "bf16": [0.0, 0.0]}
    targets = []
    for dtype in ("tf32", "bf16"):
        for batch in ((8,) if args.quick else (1, 8)):
            for backward in (False, True):
                for conv in cases:
                    ms, tms, plan = time_conv(conv, batch, dtype, backward)
                    flops = conv.flops(batch) * (3 if backward else 1)
                    rate = flops / (ms * 1e-3)
                    cells = (conv.label(), batch, "fwd+bwd" if backward else "fwd", dtype, f"{ms:.4f}",
                             f"{tms:.4f}", f"{tms / ms:.2f}", f"{rate / 1e12:.1f}", f"{rate / PEAK[dtype]:.2f}",
                             f"{flops / (tms * 1e-3) / 1e12:.1f}", plan)
                    table.row(*cells)
                    if batch == 1 and not backward and conv in convs:
                        forward_sum[dtype][0] += convs[conv] * ms
                        forward_sum[dtype][1] += convs[conv] * tms
                    if batch == 8 and conv == target:
                        targets.append(cells)
    if args.tiles:
        tile_sweep()
    table = bench_report.Table("Targets ([8,128,64,64] -> 128; speed = torch ms / tc ms)", columns, first=24)
    for cells in targets:
        table.row(*cells)
    if not args.quick:
        table = bench_report.Table("UNet forward convolutions, batch 1 (each times its count per forward)",
                                   ["dtype", "tensorcore ms", "torch ms", "speed"])
        for dtype, (ours, theirs) in forward_sum.items():
            table.row(dtype, f"{ours:.3f}", f"{theirs:.3f}", f"{theirs / ours:.2f}")


def tile_sweep() -> None:
    """Every forward / weight-gradient tile and a few splits on the target shapes."""
    table = bench_report.Table("Tile sweep (tensorcore ms per tile / split)",
                               ["dtype", "B", "conv", "kernel", "tile/warps/split: ms"])
    for dtype, prec in (("tf32", conv_plan.PREC_TF32), ("bf16", conv_plan.PREC_16)):
        for conv, batch in ((Conv(128, 128, 3, 1, 64), 8), (Conv(512, 512, 3, 1, 32), 1)):
            (x, w, g), _ = operands(conv, batch, dtype)
            geo = ((1, 1), (1, 1), (1, 1), 1)
            for kernel, call in ((conv_plan.FPROP, lambda: GPU.conv2d(x, w, *geo)),
                                 (conv_plan.WGRAD,
                                  lambda: GPU.conv2d_grad_weight(g, x, w.shape, *geo))):
                cells = []
                for tile in dict.fromkeys(t for wgmma in (False, True)
                                          for t in conv_plan.tiles(kernel, prec, wgmma)):
                    for splits in (1, 2, 4, 8, 16, 32):
                        with conv_plan.forced(kernel, conv_plan.Plan(tile, splits)):
                            ms = graph_ms(call, 15)
                        if conv_plan.last[kernel] != conv_plan.Plan(tile, splits):
                            continue  # a tile the call's path does not run
                        cells.append(f"{tile.bm}x{tile.bn}x{tile.bk}/{tile.warps_m * tile.warps_n}w"
                                     f"{'g' if tile.wgmma else ''}/{splits}: {ms:.4f}")
                table.row(dtype, batch, conv.label(), kernel, "  ".join(cells))


if __name__ == "__main__":
    main()
