"""The Numba backend's calls in the small-CNN step of ``cpu_threads.py``, each on its own.

    python tests/benchmarks/cpu_step_kernels.py [--threads 1] [--calls 300] [--blocks 7]

Every backend call of the step's forward and backward passes (Conv2d 1->16 and 16->32
with bias, ReLU, MaxPool2d(2) on a batch of 64 8x8 images), on the step's float32
shapes and random data (four batches taken in turn), at ``--threads`` threads
(``tc.set_num_threads``).  Each figure is the median over ``--blocks`` blocks of
``--calls`` back-to-back calls, in microseconds per call: back to back, freed arrays
are reused and the pool's threads stay awake, so these are the calls' own costs,
below what they cost inside a step.  The
calls go through the backend's methods, so the script runs on any version of the
kernels.  No timing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import numpy as np

import tensorcore as tc
import bench_report  # tests/benchmarks/bench_report.py

GEO = ((1, 1), (1, 1), (1, 1), 1)  # stride, padding, dilation, groups
BATCHES = 4  # inputs taken in turn, as the step's batches: one array over and over
# would let the branch predictor learn it, flattering data-dependent branches


def cases() -> dict[str, Callable[[int], object]]:
    """name -> call(i), the i-th call taking the i-th of four random batches."""
    be = tc.get_backend()
    rng = np.random.default_rng(0)

    def rand(*shape: int) -> list[np.ndarray]:
        return [rng.standard_normal(shape, dtype=np.float32) for _ in range(BATCHES)]

    x, h1, h2 = rand(64, 1, 8, 8), rand(64, 16, 8, 8), rand(64, 32, 8, 8)
    w1, w2, b1, b2 = rand(16, 1, 3, 3), rand(32, 16, 3, 3), rand(16), rand(32)
    pooled = [be.max_pool2d(h, (2, 2), (2, 2), (0, 0)) for h in h2]
    g_pool = rand(*pooled[0][0].shape)
    return {
        "conv2d 1->16 + bias": lambda i: be.conv2d(x[i], w1[i], *GEO, bias=b1[i]),
        "conv2d 16->32 + bias": lambda i: be.conv2d(h1[i], w2[i], *GEO, bias=b2[i]),
        "relu [64,32,8,8]": lambda i: be.unary("relu", h2[i]),
        "relu backward [64,32,8,8]": lambda i: be.activation_grad("relu", h2[i], h2[i - 1]),
        "bias + relu [64,32,8,8]": lambda i: be.bias_act(h2[i], b2[i], "relu", 1),
        "bias + relu backward [64,32,8,8]": lambda i: be.bias_act_backward(h2[i - 1], h2[i], b2[i], "relu", 1),
        "max_pool2d 2x2 [64,32,8,8]": lambda i: be.max_pool2d(h2[i], (2, 2), (2, 2), (0, 0)),
        "max_pool2d 3x3 s2 p1 [64,32,8,8]": lambda i: be.max_pool2d(h2[i], (3, 3), (2, 2), (1, 1)),
        "max_pool2d backward": lambda i: be.max_pool2d_backward(g_pool[i], pooled[i][1], h2[i].shape),
        "conv2d_grad_input 16->32": lambda i: be.conv2d_grad_input(h2[i], w2[i], h1[i].shape, *GEO),
        "conv2d_grad_weight 16->32": lambda i: be.conv2d_grad_weight(h2[i], h1[i], w2[i].shape, *GEO),
        "conv2d_grad_weight 1->16": lambda i: be.conv2d_grad_weight(h1[i], x[i], w1[i].shape, *GEO),
    }


def median_us(fn: Callable[[int], object], calls: int, blocks: int) -> float:
    for i in range(max(calls // 10, 3)):  # warm-up (and kernel loading)
        fn(i % BATCHES)
    samples = []
    for _ in range(blocks):
        start = time.perf_counter()
        for i in range(calls):
            fn(i % BATCHES)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=300, help="calls per timed block")
    parser.add_argument("--blocks", type=int, default=7, help="timed blocks (the median is reported)")
    args = bench_report.parse(parser)
    tc.set_num_threads(args.threads)
    table = bench_report.Table(f"{tc.get_num_threads()} threads; median of {args.blocks} blocks of {args.calls} "
                               "calls", ["call", "us per call"], first=36)
    for name, fn in cases().items():
        table.row(name, f"{median_us(fn, args.calls, args.blocks):.1f}")


if __name__ == "__main__":
    main()
