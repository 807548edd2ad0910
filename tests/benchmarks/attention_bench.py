"""Flash attention against PyTorch's scaled_dot_product_attention at SD-1.5's shapes.

    TENSORCORE_BACKEND=cupy python tests/benchmarks/attention_bench.py [--dtype float16|bfloat16] [--backward]

Each row is one attention of the SD-1.5 UNet at 512² and batch 2 (8 heads): the
self-attention of each level (4096, 1024, 256, 64 tokens; head dims 40, 80, 160, 160)
and the cross-attention over 77 text tokens at the first level.  Ours is
``flash_attention.forward`` on heads read out of [B, L, H·d] projections, as the UNet
calls it; PyTorch's is ``torch.nn.functional.scaled_dot_product_attention`` on the same
layout (its fastest kernel for the GPU: FlashAttention or cuDNN).  Times are medians of
CUDA-event-timed calls; TFLOP/s counts 4·B·H·Lq·Lk·d.  ``--backward`` times the
gradients instead: ours ``flash_attention_bwd.backward`` given the forward's output and
log-sum-exp, PyTorch ``torch.autograd.grad`` through SDPA's saved forward (TFLOP/s counts
the backward's 2.5 times the forward's products).  Nothing is asserted.
"""

from __future__ import annotations

import argparse

import bench_report  # tests/benchmarks/bench_report.py

SHAPES = [  # (label, query tokens, key tokens, head dim)
    ("level 1 self", 4096, 4096, 40),
    ("level 1 cross", 4096, 77, 40),
    ("level 2 self", 1024, 1024, 80),
    ("level 2 cross", 1024, 77, 80),
    ("level 3 self", 256, 256, 160),
    ("mid self", 64, 64, 160),
]
BATCH, HEADS = 2, 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    parser.add_argument("--backward", action="store_true", help="time the gradients instead of the forward")
    args = bench_report.parse(parser)
    import cupy as cp
    import torch
    import torch.nn.functional as TF
    from gpu_timing import event_ms  # tests/benchmarks/gpu_timing.py

    from tensorcore.backends.cupy import flash_attention, flash_attention_bwd

    dtype = getattr(torch, args.dtype)
    work = "backward" if args.backward else "forward"
    table = bench_report.Table(f"attention {work} at SD-1.5 shapes, batch {BATCH}, {HEADS} heads, {args.dtype}",
                               ["attention", "Lq x Lk, d", "ours ms", "torch ms", "ours / torch time",
                                "ours TFLOP/s", "torch TFLOP/s"])
    for label, lq, lk, d in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, g = (torch.randn(BATCH, n, HEADS * d, device="cuda", dtype=dtype, generator=gen)
                      .view(BATCH, n, HEADS, d).transpose(1, 2) for n in (lq, lk, lk, lq))
        qc, kc, vc, gc = (cp.from_dlpack(t) for t in (q, k, v, g))
        scale = d ** -0.5
        flops = 4 * BATCH * HEADS * lq * lk * d
        if args.backward:
            out, lse = flash_attention.forward(qc, kc, vc, False, scale, with_lse=True)
            ours = event_ms(lambda: flash_attention_bwd.backward(gc, qc, kc, vc, out, lse, False, scale))
            q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
            saved = TF.scaled_dot_product_attention(q, k, v, scale=scale)
            theirs = event_ms(lambda: torch.autograd.grad(saved, (q, k, v), g, retain_graph=True))
            flops = flops * 5 // 2
        else:
            ours = event_ms(lambda: flash_attention.forward(qc, kc, vc, False, scale))
            theirs = event_ms(lambda: TF.scaled_dot_product_attention(q, k, v, scale=scale))
        table.row(label, f"{lq} x {lk}, {d}", f"{ours:.4f}", f"{theirs:.4f}", f"{ours / theirs:.2f}",
                  f"{flops / ours / 1e9:.0f}", f"{flops / theirs / 1e9:.0f}")


if __name__ == "__main__":
    main()
