"""Where the time of the GPU convolution goes: conv3x3 [8,128,64,64] -> 128 (TF32) split
into im2col, the GEMMs and col2im, each timed as a replayed CUDA graph, with the bytes
each part must move and the GB/s or TFLOP/s it reached.

    PYTHONPATH=. python3 tests/benchmarks/conv_parts.py
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from tensorcore import settings
from tensorcore.backends.cupy.loader import launch
from tensorcore.backends.cupy.backend import CupyBackend
from tensorcore.backends.cupy.linalg import CONV, _gemm
import bench_report  # tests/benchmarks/bench_report.py
from gpu_timing import graph_ms  # tests/benchmarks/gpu_timing.py

GPU = CupyBackend()
N, C, H, W, COUT = 8, 128, 64, 64, 128


def main() -> None:
    bench_report.parse(__doc__)
    settings.set_matmul_precision("high")
    x = cp.random.standard_normal((N, C, H, W), dtype=np.float32)
    w = cp.random.standard_normal((COUT, C, 3, 3), dtype=np.float32)
    g = cp.random.standard_normal((N, COUT, H, W), dtype=np.float32)
    big_k, ohw = C * 9, H * W
    col = cp.empty((N, big_k, ohw), dtype=np.float32)
    out = cp.empty((N, COUT, H, W), dtype=np.float32)
    dx = cp.empty_like(x)
    geo = ((1, 1), (1, 1), (1, 1), 1)
    im2col = (lambda: launch(CONV, "im2col_kernel", x.dtype, N * C * ohw,
                             (x, col, N, C, H, W, 3, 3, 1, 1, 1, 1, 1, 1, H, W)))
    gemm_fwd = (lambda: _gemm(False, False, COUT, ohw, big_k, (w, 0, big_k, 0),
                              (col, 0, ohw, big_k * ohw), (out, 0, ohw, COUT * ohw), N))
    gemm_dcol = (lambda: _gemm(True, False, big_k, ohw, COUT, (w, 0, big_k, 0),
                               (g, 0, ohw, COUT * ohw), (col, 0, ohw, big_k * ohw), N))
    col2im = (lambda: launch(CONV, "col2im_kernel", x.dtype, x.size,
                             (col, dx, N, C, H, W, 3, 3, 1, 1, 1, 1, 1, 1, H, W)))
    flops = 2 * N * COUT * ohw * big_k
    col_bytes = col.nbytes
    rows = [("im2col", im2col, col_bytes + x.nbytes, "GB/s"),
            ("GEMM out = w @ col", gemm_fwd, flops, "TFLOP/s"),
            ("GEMM col = w^T @ grad", gemm_dcol, flops, "TFLOP/s"),
            ("col2im", col2im, col_bytes + x.nbytes, "GB/s"),
            ("conv2d forward", lambda: GPU.conv2d(x, w, *geo), flops, "TFLOP/s"),
            ("conv2d grad input", lambda: GPU.conv2d_grad_input(g, w, x.shape, *geo), flops,
             "TFLOP/s"),
            ("conv2d grad weight", lambda: GPU.conv2d_grad_weight(g, x, w.shape, *geo), flops,
             "TFLOP/s")]
    table = bench_report.Table(f"conv3x3 [8,128,64,64] -> 128, TF32: column matrix {col_bytes / 2**20:.0f} MiB, "
                               f"{flops / 1e9:.2f} GFLOP per GEMM", ["part", "us", "rate", "unit"], first=24)
    for name, fn, amount, unit in rows:
        ms = graph_ms(fn)
        scale = 1e9 if unit == "GB/s" else 1e12
        table.row(name, f"{ms * 1e3:.1f}", f"{amount / (ms * 1e-3) / scale:.1f}", unit)


if __name__ == "__main__":
    main()
