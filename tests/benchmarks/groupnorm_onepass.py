"""The GroupNorm forward kernels side by side on UNet-like shapes, as replayed CUDA
graphs, next to torch (queued eager calls) and a device copy of the tensor: the two
one-pass kernels, cuda/groupnorm_cluster.cu (a cluster of blocks per statistic) and
cuda/groupnorm_resident.cu (whole tensor on chip, one grid barrier), and the two-pass
kernels of cuda/planenorm.cu.  Each output is checked against a float64 reference
first.  "-" marks a kernel that does not apply; "picked" is the one-pass kernel the
backend prefers for the shape (it falls back to the other where that one declines).

    PYTHONPATH=. python3 tests/benchmarks/groupnorm_onepass.py
"""

from __future__ import annotations

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F

from tensorcore.backends.cupy import groupnorm as gn
from tensorcore.backends.cupy.backend import CupyBackend
import bench_report  # tests/benchmarks/bench_report.py
from gpu_timing import graph_ms, queued_ms  # tests/benchmarks/gpu_timing.py

SHAPES = [((8, 256, 64, 64), 32, "float32"), ((8, 256, 64, 64), 32, "float16"),
          ((1, 128, 128, 128), 32, "float32"), ((8, 128, 32, 32), 32, "float32"),
          ((8, 64, 32, 32), 32, "float32"), ((2, 512, 16, 16), 32, "float32"),
          ((4, 320, 64, 64), 32, "float32"), ((16, 256, 64, 64), 32, "float32"),
          ((1, 256, 128, 128), 32, "float32"), ((1, 64, 256, 256), 32, "float32"),
          ((1, 4, 512, 512), 1, "float32"), ((2, 512, 64, 64), 32, "float32")]


GPU = CupyBackend()


def reference(x, w, b, groups: int):
    n, c = x.shape[:2]
    xs = x.astype(np.float64).reshape(n, groups, -1)
    mean, var = xs.mean(-1, keepdims=True), xs.var(-1, keepdims=True)
    y = ((xs - mean) / np.sqrt(var + 1e-5)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return y * w.reshape(shape) + b.reshape(shape)


def run(name: str, fn, x, ref) -> str:
    """fn(): (y, mean, rstd) or None.  The time in us, after a correctness check."""
    out = fn()
    if out is None:
        return "-"
    tol = 2e-2 if x.dtype == np.float16 else 1e-4
    err = float(np.max(np.abs(out[0].get().astype(np.float64) - ref)))
    assert err < tol * max(1.0, float(np.max(np.abs(ref)))), (name, err)
    return f"{graph_ms(fn) * 1e3:.1f}"


def main() -> None:
    bench_report.parse(__doc__)
    table = bench_report.Table("GroupNorm forward, us (speedup = torch / best)",
                               ["shape", "dtype", "MiB", "copy", "resident", "cluster", "two-pass", "torch", "speedup",
                                "picked"], first=20)
    for shape, groups, dtype in SHAPES:
        x = (cp.random.standard_normal(shape, dtype=np.float32) * 2 + 0.5).astype(dtype)
        w = cp.random.standard_normal(shape[1], dtype=np.float32).astype(dtype)
        b = cp.random.standard_normal(shape[1], dtype=np.float32).astype(dtype)
        y = cp.empty_like(x)
        ref = reference(x.get(), w.get(), b.get(), groups)
        n, c = shape[:2]
        s = x.size // (n * c)
        stat_len = c // groups * s
        args = (x, None, w, b, (n, groups), stat_len, s, 1e-5, "none")
        copy = graph_ms(lambda: cp.cuda.runtime.memcpyAsync(
            y.data.ptr, x.data.ptr, x.nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
            cp.cuda.get_current_stream().ptr)) * 1e3
        resident = run("resident", lambda: gn._resident(*args), x, ref)
        cluster = run("cluster", lambda: gn.clustered(*args), x, ref)
        two_pass = run("two-pass", lambda: GPU._plane_forward(x, w, b, (n, groups), c // groups,
                                                                False, 1e-5, "none"), x, ref)
        tx, tw, tb = (torch.from_dlpack(a) for a in (x, w, b))
        t = queued_ms(lambda: F.group_norm(tx, groups, tw, tb, 1e-5)) * 1e3
        best = min(float(v) for v in (resident, cluster, two_pass) if v != "-")
        first = gn.forward_kernels(n * groups, stat_len // (16 // x.itemsize))[0]
        picked = "cluster" if first is gn.clustered else "resident"
        table.row(list(shape), dtype, f"{x.nbytes / 2**20:.0f}", f"{copy:.1f}", resident, cluster, two_pass,
                  f"{t:.1f}", f"{t / best:.2f}x", picked)


if __name__ == "__main__":
    main()
