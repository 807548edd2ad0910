"""Thin convolutions on the Numba backend: the direct loops (``FEW_OUT``) against the
im2col / small-K routing they replace, per pass, as output channels grow.

    TENSORCORE_BACKEND=numba PYTHONPATH=. python tests/benchmarks/cpu_thin_conv.py [--repeat 40]

Prints one row per shape: forward, input gradient and weight gradient, ms per
call "before -> direct", best of ``--repeat`` calls (the two routings interleaved, so
a slow spell of the machine hits both), and which one ``conv_algorithm`` now picks.
float32, padding 1 for 3x3 and 0 for 1x1, stride 1 unless marked; nothing is asserted.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import bench_report  # tests/benchmarks/bench_report.py
from tensorcore.backends.numba import spatial
from tensorcore.backends.numba.backend import NumbaBackend

Shape = tuple[int, ...]
Pair = tuple[int, int]
CASES: list[tuple[Shape, Shape, int, int]] = (  # x, w, groups, stride
    [((64, 32, 8, 8), (c, 32, 3, 3), 1, 1) for c in (1, 2, 3, 4, 5, 6, 8)]
    + [((64, 64, 16, 16), (c, 64, 3, 3), 1, 1) for c in (1, 2, 4, 6, 8)]
    + [((16, 32, 32, 32), (c, 32, 3, 3), 1, 1) for c in (1, 2, 4, 8)]
    + [((64, 64, 16, 16), (c, 64, 1, 1), 1, 1) for c in (1, 2)]
    + [((64, 32, 16, 16), (c, 32, 3, 3), 1, 2) for c in (1, 2)]
    + [((64, 64, 16, 16), (64, 1, 3, 3), 64, 1), ((64, 1, 8, 8), (32, 1, 3, 3), 1, 1)])
CHOSEN = spatial.conv_algorithm


def before(pass_name: str, w_shape: Shape, stride: Pair, padding: Pair, dilation: Pair,
           groups: int, n: int, plane_hw: Pair) -> str:
    """The routing without the direct loops: a thin weight goes where 63 output channels
    per group would (too few for Winograd; the same contraction for the small-K test)."""
    args = (stride, padding, dilation, groups, n, plane_hw)
    if CHOSEN(pass_name, w_shape, *args) == spatial.FEW_OUT:
        w_shape = (63 * groups,) + tuple(w_shape[1:])
    return CHOSEN(pass_name, w_shape, *args)


def direct(*_args: object) -> str:
    return spatial.FEW_OUT


def row(be: NumbaBackend, xs: Shape, ws: Shape, groups: int, stride: int, repeat: int) -> list[str]:
    rng = np.random.default_rng(0)
    x, w = rng.random(xs, dtype=np.float32), rng.random(ws, dtype=np.float32)
    pad = ws[2] // 2
    geo = ((stride, stride), (pad, pad), (1, 1), groups)
    g = rng.random(be.conv2d(x, w, *geo).shape, dtype=np.float32)
    calls = [lambda: be.conv2d(x, w, *geo), lambda: be.conv2d_grad_input(g, w, xs, *geo),
             lambda: be.conv2d_grad_weight(g, x, ws, *geo)]
    best = np.full((2, 3), np.inf)
    for rep in range(repeat + 1):  # the first round compiles and warms up
        for k, routing in enumerate((before, direct)):
            spatial.conv_algorithm = routing
            for j, call in enumerate(calls):
                start = time.perf_counter()
                call()
                if rep:
                    best[k, j] = min(best[k, j], (time.perf_counter() - start) * 1e3)
    spatial.conv_algorithm = CHOSEN
    picked = CHOSEN("forward", ws, *geo, xs[0], g.shape[2:]) == spatial.FEW_OUT
    cells = [f"{best[0, j]:.2f} -> {best[1, j]:.2f}" for j in range(3)]
    name = (f"x {list(xs)}, w {list(ws)}" + (f", groups {groups}" if groups > 1 else "")
            + (f", stride {stride}" if stride > 1 else ""))
    return [name, *cells, "direct" if picked else "as before"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=40)
    args = bench_report.parse(parser)
    be = NumbaBackend()
    table = bench_report.Table(f"ms per call, im2col / small-K -> direct, best of {args.repeat}",
                               ["shape", "forward", "input gradient", "weight gradient", "picked"], first=40)
    for xs, ws, groups, stride in CASES:
        table.row(*row(be, xs, ws, groups, stride, args.repeat))


if __name__ == "__main__":
    main()
