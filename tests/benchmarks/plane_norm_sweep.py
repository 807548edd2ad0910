"""Launch-shape sweep of the two-pass GroupNorm / BatchNorm kernels (cuda/planenorm.cu:
BatchNorm, and GroupNorm before Hopper or for groups too large for a cluster) on the
UNet shape [8, 256, 64, 64], 32 groups: the statistics pass and the normalise pass timed apart,
as replayed CUDA graphs, for several packs per thread (PLANE_BATCH), threads per block
and chunks per plane, next to a device copy of the same tensor.

    PYTHONPATH=. python3 tests/benchmarks/plane_norm_sweep.py
"""

from __future__ import annotations

import itertools

import cupy as cp
import numpy as np

from tensorcore.backends.cupy import loader
from tensorcore.backends.cupy.util import NULL, DeviceBuffers, zeroed_counters
import bench_report  # tests/benchmarks/bench_report.py
from gpu_timing import graph_ms  # tests/benchmarks/gpu_timing.py

N, C, H, W, GROUPS = 8, 256, 64, 64, 32
BUFFERS = DeviceBuffers()


def module(batch: int):
    text = loader.source("planenorm.cu")
    text = text.replace("#define PLANE_BATCH 4", f"#define PLANE_BATCH {batch}")
    text = text.replace("__launch_bounds__(256, 6) ", "")
    return cp.RawModule(code=text, options=loader.OPTIONS,
                        name_expressions=["plane_stats_kernel<float>", "plane_apply_kernel<float>"])


def main() -> None:
    bench_report.parse(__doc__)
    x = cp.random.standard_normal((N, C, H, W), dtype=np.float32)
    y = cp.empty_like(x)
    w = cp.random.standard_normal(C, dtype=np.float32)
    s, cpg, stats = H * W, C // GROUPS, N * GROUPS
    mean, rstd = cp.empty((2, stats), dtype=np.float32)
    copy = graph_ms(lambda: cp.cuda.runtime.memcpyAsync(
        y.data.ptr, x.data.ptr, x.nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
        cp.cuda.get_current_stream().ptr))
    table = bench_report.Table(f"copy {x.nbytes >> 20} MiB: {copy * 1e3:.1f} us ({2 * x.nbytes / copy / 1e6:.0f} GB/s)",
                               ["batch", "threads", "chunks", "stats us", "apply us", "both us", "stats GB/s",
                                "apply GB/s"])
    for batch in (2, 4, 8):
        mod = module(batch)
        st = mod.get_function("plane_stats_kernel<float>")
        ap = mod.get_function("plane_apply_kernel<float>")
        for threads, chunks in itertools.product((128, 256, 512), (1, 2, 4)):
            part = cp.empty(N * C * chunks * 3, dtype=np.float32)
            grid = (N * C, chunks)

            def stats_pass(threads=threads, chunks=chunks, part=part, grid=grid, st=st):
                st(grid, (threads,), (x, NULL, part, mean, rstd, NULL, NULL,
                                      zeroed_counters(BUFFERS, stats), s, chunks, C, cpg, 0, N,
                                      1e-5, 0.0, 1))

            def apply_pass(threads=threads, chunks=chunks, grid=grid, ap=ap):
                ap(grid, (threads,), (x, NULL, w, w, mean, rstd, y, NULL,
                                      NULL, s, chunks, C, cpg, 0, N, 1e-5, 0, 0, 1))

            t_stats, t_apply = graph_ms(stats_pass), graph_ms(apply_pass)
            t_both = graph_ms(lambda: (stats_pass(), apply_pass()))
            table.row(batch, threads, chunks, f"{t_stats * 1e3:.1f}", f"{t_apply * 1e3:.1f}", f"{t_both * 1e3:.1f}",
                      f"{x.nbytes / t_stats / 1e6:.0f}", f"{2 * x.nbytes / t_apply / 1e6:.0f}")


if __name__ == "__main__":
    main()
