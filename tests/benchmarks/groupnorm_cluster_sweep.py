"""Shape sweep of the one-pass cluster GroupNorm kernel (cuda/groupnorm_cluster.cu) on
[8, 256, 64, 64], 32 groups, as replayed CUDA graphs: blocks per cluster, packs per
thread, threads per block and register caps ("lbN": registers for N 512-thread blocks
per SM; the shipped kernel is lb3), plus one 1024-thread block per group without a
cluster, next to a device copy of the tensor.  Two diagnostic
variants time the same data movement without the cluster exchange (each block uses
its own partial, so their output is not a GroupNorm): "no exchange" keeps the cluster
launch, "no cluster" drops it too.

    PYTHONPATH=. python3 tests/benchmarks/groupnorm_cluster_sweep.py
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from tensorcore.backends.cupy import loader
from tensorcore.backends.cupy.util import NULL
import bench_report  # tests/benchmarks/bench_report.py
from gpu_timing import graph_ms  # tests/benchmarks/gpu_timing.py

N, C, H, W, GROUPS = 8, 256, 64, 64, 32


STREAMING_LOAD = ("v[q] = in[i];", "*reinterpret_cast<float4*>(&v[q]) = "
                  "__ldcs(reinterpret_cast<const float4*>(in + i));")
STREAMING_STORE = ("out[i] = o;", "__stcs(reinterpret_cast<float4*>(out + i), "
                   "*reinterpret_cast<const float4*>(&o));")


def variant(cluster: int, packs: int, exchange: bool = True, clustered: bool = True,
            min_blocks: int = 0, hints: tuple = ()):
    text = loader.source("groupnorm_cluster.cu")
    for old, new in hints:  # cache-streaming loads / stores instead of the default policy
        assert old in text
        text = text.replace(old, new)
    bounds = {0: "__launch_bounds__(512)", 1024: "__launch_bounds__(1024, 1)"}.get(
        1024 if cluster == 1 else min_blocks, f"__launch_bounds__(512, {min_blocks})")
    text = text.replace("__launch_bounds__(512, 3)", bounds)  # the shipped cap
    text = text.replace("#define CLUSTER 8", f"#define CLUSTER {cluster}")
    text = text.replace("#define GN_PACKS 4", f"#define GN_PACKS {packs}")
    if not exchange:
        text = text.replace("unsigned int r = threadIdx.x;", "unsigned int r = rank;")
    if not clustered:
        text = text.replace("#define CLUSTER_DIMS __cluster_dims__(CLUSTER, 1, 1)",
                            "#define CLUSTER_DIMS")
        text = text.replace('asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");',
                            "__syncthreads();")
        text = text.replace('asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");', "")
        text = text.replace('asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"\n'
                            '                 : "=r"(remote) : "r"((unsigned int)local), "r"(rank));',
                            "remote = (unsigned int)local;")
        text = text.replace("ld.shared::cluster.f32", "ld.shared.f32")
        text = text.replace("ld.shared::cluster.f64", "ld.shared.f64")
    mod = cp.RawModule(code=text, options=loader.OPTIONS,
                       name_expressions=["group_norm_cluster_kernel<float>"])
    return mod.get_function("group_norm_cluster_kernel<float>")


def main() -> None:
    bench_report.parse(__doc__)
    x = cp.random.standard_normal((N, C, H, W), dtype=np.float32)
    y = cp.empty_like(x)
    w = cp.random.standard_normal(C, dtype=np.float32)
    s, stats = H * W, N * GROUPS
    stat_len = C // GROUPS * s
    mean, rstd = cp.empty((2, stats), dtype=np.float32)
    copy = graph_ms(lambda: cp.cuda.runtime.memcpyAsync(
        y.data.ptr, x.data.ptr, x.nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
        cp.cuda.get_current_stream().ptr))
    table = bench_report.Table(f"copy {x.nbytes >> 20} MiB: {copy * 1e3:.1f} us ({2 * x.nbytes / copy / 1e6:.0f} GB/s)",
                               ["cluster", "packs", "threads", "variant", "us", "GB/s"])
    # (blocks per cluster, packs per thread, threads, register cap for N 512-thread blocks)
    cases = [(8, 4, 256, 0), (8, 4, 256, 3), (8, 4, 256, 4), (8, 8, 128, 0), (8, 2, 512, 0),
             (4, 8, 256, 0), (4, 4, 512, 0), (4, 4, 512, 2), (2, 8, 512, 0), (1, 8, 1024, 0)]
    for cluster, packs, threads, min_blocks in cases:
        for name, exchange, clustered in (("one pass", True, True), ("no exchange", False, True),
                                          ("no cluster", False, False)):
            if name != "one pass" and (cluster, packs, threads, min_blocks) != (8, 4, 256, 3):
                continue
            if cluster == 1:  # a block per group needs no cluster: "no cluster" is exact
                exchange, clustered, name = False, False, "block per group"
            fn = variant(cluster, packs, exchange, clustered, min_blocks)
            args = (x, NULL, w, w, y, mean, rstd, stat_len, s, C, 1e-5, 0)
            t = graph_ms(lambda: fn((stats * cluster,), (threads,), args))
            label = name + (f" lb{min_blocks}" if min_blocks else "")
            table.row(cluster, packs, threads, label, f"{t * 1e3:.1f}", f"{2 * x.nbytes / t / 1e6:.0f}")
    for label, hints in (("ld.cs", (STREAMING_LOAD,)), ("st.cs", (STREAMING_STORE,)),
                         ("ld.cs + st.cs", (STREAMING_LOAD, STREAMING_STORE))):
        fn = variant(8, 4, min_blocks=3, hints=hints)
        t = graph_ms(lambda: fn((stats * 8,), (256,), (x, NULL, w, w, y, mean, rstd, stat_len, s, C,
                                                      1e-5, 0)))
        table.row(8, 4, 256, label, f"{t * 1e3:.1f}", f"{2 * x.nbytes / t / 1e6:.0f}")

if __name__ == "__main__":
    main()
