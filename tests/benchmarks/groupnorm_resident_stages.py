"""Where the time of the resident GroupNorm kernel (cuda/groupnorm_resident.cu) goes:
the kernel built with an early exit after each stage, timed as a replayed CUDA graph.
Stages: launch only; loads + per-thread sums; block sums; grid barrier + merge; the
whole kernel (normalise + stores).  Each is timed with the L2 warm (the same input
replayed) and cold (a 256 MiB memset, timed apart and subtracted, runs first: as in a
network, the L2 then holds dirty lines that the loads must evict).

    PYTHONPATH=. python3 tests/benchmarks/groupnorm_resident_stages.py
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from tensorcore.backends.cupy import loader
from tensorcore.backends.cupy.util import NULL
from tensorcore.backends.cupy.groupnorm import RES_REG_PACKS, RES_SHARED_PACKS, RES_THREADS
import bench_report  # tests/benchmarks/bench_report.py
from gpu_timing import graph_ms  # tests/benchmarks/gpu_timing.py

# stage code (passed as `act`) -> (text of the kernel, the same with an exit after it)
EXIT = "    if (act == {}) return;\n"
STAGES = {
    100: ("    typedef acc_t<T> A;\n", "    typedef acc_t<T> A;\n" + EXIT.format(100)),
    101: ("    close_run();\n    block_sums(sums, scratch);\n",
          "    close_run();\n"
          "    if (act == 101) {  // keep the sums alive\n"
          "        if (sums[0] == (A)-1 && sums[RES_STATS] == (A)-1) y[0] = v[0].v[0];\n"
          "        return;\n    }\n"
          "    block_sums(sums, scratch);\n"),
    102: ("    cooperative_groups::this_grid().sync();",
          EXIT.format(102) + "    cooperative_groups::this_grid().sync();"),
    103: ("    __syncthreads();\n\n    // The channel",
          "    __syncthreads();\n" + EXIT.format(103) + "\n    // The channel"),
}
NAMES = {100: "launch", 101: "loads + sums", 102: "+ block sums", 103: "+ barrier, merge",
         0: "whole kernel"}


def staged_kernel():
    text = loader.source("groupnorm_resident.cu")
    for anchor, replacement in STAGES.values():
        assert text.count(anchor) == 1, anchor
        text = text.replace(anchor, replacement)
    mod = cp.RawModule(code=text, options=loader.OPTIONS, enable_cooperative_groups=True,
                       name_expressions=["group_norm_resident_kernel<float>"])
    kernel = mod.get_function("group_norm_resident_kernel<float>")
    kernel.max_dynamic_shared_size_bytes = RES_SHARED_PACKS * RES_THREADS * 16
    return kernel


def main() -> None:
    bench_report.parse(__doc__)
    kernel = staged_kernel()
    flush_buffer = cp.empty(256 << 20, dtype=np.uint8)

    def flush():
        cp.cuda.runtime.memsetAsync(flush_buffer.data.ptr, 1, flush_buffer.nbytes,
                                    cp.cuda.get_current_stream().ptr)

    flush_us = graph_ms(flush) * 1e3
    table = bench_report.Table(f"256 MiB memset: {flush_us:.1f} us ({flush_buffer.nbytes / flush_us / 1e3:.0f} GB/s)",
                               ["shape", "stage", "warm us", "cold us"], first=18)
    for shape, groups in (((8, 256, 64, 64), 32), ((2, 512, 16, 16), 32)):
        x = cp.random.standard_normal(shape, dtype=np.float32) * 2 + 0.5
        w = cp.random.standard_normal(shape[1], dtype=np.float32)
        y = cp.empty_like(x)
        n, c = shape[:2]
        s = x.size // (n * c)
        stat_len = c // groups * s
        packs, stat_packs = x.size // 4, stat_len // 4
        grid = min(max(-(-packs // (RES_THREADS * RES_REG_PACKS)), -(-packs // (3 * stat_packs))),
                   loader.sm_count())
        chunk = -(-packs // grid)
        grid = -(-packs // chunk)
        shared = max(0, -(-chunk // RES_THREADS) - RES_REG_PACKS) * RES_THREADS * 16
        mean, rstd = cp.empty((2, n * groups), dtype=np.float32)
        partials = cp.empty(grid * 8, dtype=np.float32)
        for code in (*STAGES, 0):
            args = (x, NULL, w, w, y, mean, rstd, partials,
                    *map(np.int32, (packs, chunk, stat_len, s, c)), 1e-5, np.int32(code))

            def run():
                kernel((grid,), (RES_THREADS,), args, shared_mem=shared)

            warm = graph_ms(run) * 1e3
            cold = graph_ms(lambda: (flush(), run())) * 1e3 - flush_us
            table.row(list(shape), NAMES[code], f"{warm:.1f}", f"{cold:.1f}")


if __name__ == "__main__":
    main()
