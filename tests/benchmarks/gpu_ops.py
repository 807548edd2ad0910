"""GPU op benchmark: the tensorcore CuPy backend next to PyTorch, in one run.

    PYTHONPATH=. python3 tests/benchmarks/gpu_ops.py                  # every row
    PYTHONPATH=. python3 tests/benchmarks/gpu_ops.py --indexed-only   # copy, add, upsample, max_pool

Times are medians of CUDA-event timings after warm-up; inputs are random (never
zeros).  Both libraries are timed eager in two ways: one call between two events
("eager": the host launch cost shows when it exceeds the GPU time, because the GPU
idles until the first kernel arrives) and 20 calls queued back to back between two
events, per call ("queued": what a training loop sees, the host running ahead of the
GPU).  tensorcore is also timed as a replayed CUDA graph of one call (the fast path for
captured steps).  Speed = torch time / tensorcore time (> 1: tensorcore faster); the
graph column is compared with torch queued.  Bandwidth counts each input read once and
each output written once.  No timing is asserted.
"""

from __future__ import annotations

import argparse
import time

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F

import gpu_timing  # tests/benchmarks/gpu_timing.py
import tensorcore as tc
from tensorcore import settings
from tensorcore.backends.cupy.backend import CupyBackend
import bench_report  # tests/benchmarks/bench_report.py
from gpu_timing import graph_ms, queued_ms  # tests/benchmarks/gpu_timing.py

GPU = CupyBackend()


median_ms = gpu_timing.event_ms


def randn_pair(*shape, dtype=np.float32):
    """The same random values as a CuPy array and a torch tensor (both round float32
    to nearest even, so a 16-bit pair holds equal values)."""
    a = cp.random.standard_normal(shape, dtype=np.float32)
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(np.dtype(dtype).name,
                                                                            torch.float32)
    return a.astype(dtype), torch.from_dlpack(a.copy()).to(torch_dtype)


ROWS: list[tuple] = []


def row(name: str, tc_fn, torch_fn, unit: str, amount: float, iters: int = 40) -> None:
    """amount: bytes (unit GB/s) or flops (unit TFLOP/s) of one call."""
    eager, queued, graphed = median_ms(tc_fn, iters), queued_ms(tc_fn), graph_ms(tc_fn, iters)
    t_eager, t_queued = median_ms(torch_fn, iters), queued_ms(torch_fn)
    scale = 1e9 if unit == "GB/s" else 1e12
    ROWS.append((name, eager, queued, graphed, t_eager, t_queued,
                 amount / (graphed * 1e-3) / scale, amount / (t_queued * 1e-3) / scale, unit))
    if unit == "GB/s":
        SAME_SIZE_COPY_MS[name] = graph_ms(copy_of(int(amount) // 2), iters)


SAME_SIZE_COPY_MS: dict[str, float] = {}  # graph-replayed copy moving a row's bytes


def copy_of(nbytes: int):
    """A device-to-device copy of ``nbytes`` (read ``nbytes``, write ``nbytes``)."""
    src, dst = cp.empty(nbytes, dtype=cp.uint8), cp.empty(nbytes, dtype=cp.uint8)
    return lambda: cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes,
                                               cp.cuda.runtime.memcpyDeviceToDevice,
                                               cp.cuda.get_current_stream().ptr)


def bench_copy_and_fused(fused: bool = True) -> None:
    n = 64 * 2**20
    x, tx = randn_pair(8, 128, 256, 256)
    ty = torch.empty_like(tx)
    row("device copy 64M f32", copy_of(x.nbytes), lambda: ty.copy_(tx), "GB/s", 8 * n)
    if not fused:
        return
    a, ta = randn_pair(128)
    b, tb = randn_pair(128)
    ta4, tb4 = ta.view(1, -1, 1, 1), tb.view(1, -1, 1, 1)
    row("silu(x*a+b) 64M f32", lambda: GPU.affine_act(x, a, b, "silu", 1),
        lambda: F.silu(tx * ta4 + tb4), "GB/s", 8 * n)
    h, th = x.astype(tc.bfloat16), tx.to(torch.bfloat16)
    ha, hb = a.astype(tc.bfloat16), b.astype(tc.bfloat16)
    tha, thb = ta4.to(torch.bfloat16), tb4.to(torch.bfloat16)
    row("silu(x*a+b) 64M bf16", lambda: GPU.affine_act(h, ha, hb, "silu", 1),
        lambda: F.silu(th * tha + thb), "GB/s", 4 * n)


def bench_rows() -> None:
    x, tx = randn_pair(4096, 4096)
    nbytes = 2 * x.nbytes
    row("softmax 4096x4096", lambda: GPU.softmax(x), lambda: torch.softmax(tx, -1), "GB/s",
        nbytes)
    w, tw = randn_pair(4096)
    b, tb = randn_pair(4096)
    row("layer_norm 4096x4096", lambda: GPU.layer_norm(x, w, b, 1, 1e-5),
        lambda: F.layer_norm(tx, (4096,), tw, tb, 1e-5), "GB/s", nbytes)
    g, tg = randn_pair(8, 256, 64, 64)
    gw, tgw = randn_pair(256)
    gb, tgb = randn_pair(256)
    row("group_norm [8,256,64,64] G=32", lambda: GPU.group_norm(g, gw, gb, 32, 1e-5),
        lambda: F.group_norm(tg, 32, tgw, tgb, 1e-5), "GB/s", 2 * g.nbytes)
    row("group_norm+silu [8,256,64,64]", lambda: GPU.group_norm(g, gw, gb, 32, 1e-5, "silu"),
        lambda: F.silu(F.group_norm(tg, 32, tgw, tgb, 1e-5)), "GB/s", 2 * g.nbytes)
    u, tu = randn_pair(1, 128, 128, 128)
    uw, tuw = randn_pair(128)
    row("group_norm [1,128,128,128] G=32", lambda: GPU.group_norm(u, uw, uw, 32, 1e-5),
        lambda: F.group_norm(tu, 32, tuw, tuw, 1e-5), "GB/s", 2 * u.nbytes)


def bench_indexed() -> None:
    """Ops whose kernels decompose each element's index: broadcasting, resampling, pooling."""
    h, th = randn_pair(8, 256, 64, 64)
    e, te = randn_pair(8, 256, 1, 1)
    row("add [8,256,64,64] + [8,256,1,1]", lambda: GPU.binary("add", h, e), lambda: th + te,
        "GB/s", 2 * h.nbytes)
    s, ts = randn_pair(8, 256, 32, 32)
    row("upsample nearest x2 [8,256,32,32]", lambda: GPU.upsample_nearest2d(s, (64, 64)),
        lambda: F.interpolate(ts, scale_factor=2, mode="nearest"), "GB/s", 5 * s.nbytes)
    # both sides write the int64 argmax too (torch's CUDA max_pool2d always computes it)
    row("max_pool 2x2 [8,256,64,64]", lambda: GPU.max_pool2d(h, (2, 2), (2, 2), (0, 0)),
        lambda: F.max_pool2d(th, 2), "GB/s", 1.25 * h.nbytes + h.size // 4 * 8)


def bench_conv() -> None:
    settings.set_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    x, tx = randn_pair(8, 128, 64, 64)
    w, tw = randn_pair(128, 128, 3, 3)
    g, tg = randn_pair(8, 128, 64, 64)
    flops = 2 * 8 * 128 * 64 * 64 * 128 * 9
    geo = ((1, 1), (1, 1), (1, 1), 1)

    def tc_step():
        return (GPU.conv2d(x, w, *geo), GPU.conv2d_grad_input(g, w, x.shape, *geo),
                GPU.conv2d_grad_weight(g, x, w.shape, *geo))

    def torch_step():
        F.conv2d(tx, tw, padding=1)
        torch.ops.aten.convolution_backward(tg, tx, tw, None, [1, 1], [1, 1], [1, 1], False,
                                            [0, 0], 1, [True, True, False])

    row("conv3x3 fwd TF32", lambda: GPU.conv2d(x, w, *geo), lambda: F.conv2d(tx, tw, padding=1),
        "TFLOP/s", flops)
    row("conv3x3 fwd+bwd TF32", tc_step, torch_step, "TFLOP/s", 3 * flops)
    hx, thx = x.astype(tc.bfloat16), tx.to(torch.bfloat16)
    hw, thw = w.astype(tc.bfloat16), tw.to(torch.bfloat16)
    row("conv3x3 fwd bf16", lambda: GPU.conv2d(hx, hw, *geo), lambda: F.conv2d(thx, thw, padding=1),
        "TFLOP/s", flops)
    settings.set_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False


def bench_matmul() -> None:
    n = 4096
    for dtype, label in ((np.float32, "fp32"), (np.float16, "fp16"), (tc.bfloat16, "bf16")):
        a, ta = randn_pair(n, n, dtype=dtype)
        b, tb = randn_pair(n, n, dtype=dtype)
        row(f"matmul 4096^3 {label}", lambda: GPU.matmul(a, b), lambda: ta @ tb, "TFLOP/s",
            2 * n**3, iters=20)


def host_us(fn, iters: int = 2000) -> float:
    """Host microseconds per call, no synchronization inside the timed loop."""
    for _ in range(100):
        fn()
    cp.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    elapsed = (time.perf_counter() - start) / iters * 1e6
    cp.cuda.Device().synchronize()
    return elapsed


def bench_launch() -> list[tuple[str, float, float]]:
    """Host time per call: a tiny op, and the multi-kernel ops whose GPU time is short
    (if host time exceeds GPU time, eager timing measures the host)."""
    x, tx = randn_pair(1)
    g, tg = randn_pair(8, 256, 64, 64)
    w, tw = randn_pair(256)
    s, ts = randn_pair(4096, 4096)
    t = tc.tensor(np.ones(1, dtype=np.float32), device="cuda")
    return [("tiny add, Tensor a + a", host_us(lambda: t + t), host_us(lambda: tx + tx)),
            ("tiny add, backend call", host_us(lambda: GPU.binary("add", x, x)),
             host_us(lambda: tx + tx)),
            ("group_norm [8,256,64,64]", host_us(lambda: GPU.group_norm(g, w, w, 32, 1e-5), 300),
             host_us(lambda: F.group_norm(tg, 32, tw, tw, 1e-5), 300)),
            ("softmax 4096x4096", host_us(lambda: GPU.softmax(s), 300),
             host_us(lambda: torch.softmax(ts, -1), 300))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--indexed-only", action="store_true", help="the copy row and the indexed rows only")
    quick = bench_report.parse(parser).indexed_only
    bench_report.note(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
                      f"CuPy {cp.__version__}, torch {torch.__version__}")
    bench_copy_and_fused(fused=not quick)
    if not quick:
        bench_rows()
    bench_indexed()
    if not quick:
        bench_conv()
        bench_matmul()
    launches = [] if quick else bench_launch()
    table = bench_report.Table(
        "Times in ms; speed = torch / tensorcore (graph against torch queued); rate of tc graph and torch queued",
        ["work", "tc eager", "tc queued", "tc graph", "torch eager", "torch queued", "speed eager",
         "speed queued", "speed graph", "tc rate", "torch rate", "unit"], first=34)
    for name, eager, queued, graphed, t_eager, t_queued, tv, pv, unit in ROWS:
        table.row(name, f"{eager:.4f}", f"{queued:.4f}", f"{graphed:.4f}", f"{t_eager:.4f}", f"{t_queued:.4f}",
                  f"{t_eager / eager:.2f}x", f"{t_queued / queued:.2f}x", f"{t_queued / graphed:.2f}x",
                  f"{tv:.1f}", f"{pv:.1f}", unit)
    copy_bw = ROWS[0][6]
    table = bench_report.Table("Bandwidth of the graph replays",
                               ["work", "% of the copy bandwidth", "% of a copy of its bytes"], first=34)
    for name, _, _, graphed, *_, tv, _, unit in ROWS[1:]:
        if unit == "GB/s":
            table.row(name, f"{tv / copy_bw * 100:.1f}", f"{SAME_SIZE_COPY_MS[name] / graphed * 100:.1f}")
    if launches:
        table = bench_report.Table("Host us per call", ["call", "tensorcore", "torch"], first=26)
        for name, tc_us, torch_us in launches:
            table.row(name, f"{tc_us:.2f}", f"{torch_us:.2f}")


if __name__ == "__main__":
    main()
