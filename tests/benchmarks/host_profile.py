"""Where the host time of one eager GPU op goes: the CuPy backend call split into its
pieces (array allocation, kernel launch, our own Python), next to PyTorch's whole op.

    PYTHONPATH=. python3 tests/benchmarks/host_profile.py

Each figure is microseconds per call on the host, no synchronization inside the timed
loop (the GPU work of these tiny calls is shorter than their launch).
"""

from __future__ import annotations

import time

import cupy as cp
import numpy as np
import torch

import tensorcore as tc
import bench_report  # tests/benchmarks/bench_report.py
from tensorcore.backends.cupy import loader
from tensorcore.backends.cupy.backend import CupyBackend
from tensorcore.backends.cupy.util import has_kernels

GPU = CupyBackend()


def host_us(fn, iters: int = 5000) -> float:
    for _ in range(200):
        fn()
    cp.cuda.Device().synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - start) / iters * 1e6)
        cp.cuda.Device().synchronize()
    return best


def driver_launcher(function, values: int):
    """A launch through ``cupy.cuda.driver.launchKernel`` with a reused parameter block:
    every argument is 8 bytes (pointers and ``long long``), written into one int64
    array whose element addresses are the kernel-parameter array."""
    block = np.zeros(values, dtype=np.int64)
    addresses = np.array([block.ctypes.data + 8 * i for i in range(values)], dtype=np.uint64)
    params = int(addresses.ctypes.data)
    fptr = int(function.ptr)
    launch = cp.cuda.driver.launchKernel

    def run(grid: int, threads: int, args: tuple) -> None:
        block[:] = args
        launch(fptr, grid, 1, 1, threads, 1, 1, 0, cp.cuda.get_current_stream().ptr, params, 0)

    run.keep = (block, addresses)
    return run


def main() -> None:
    bench_report.parse(__doc__)
    x = cp.random.standard_normal(1, dtype=np.float32)
    tx = torch.from_dlpack(x.copy())
    add = loader.raw_kernel("elementwise.cu", "binary_vec_kernel", x.dtype)
    out = cp.empty_like(x)
    n = np.int64(1)
    t = tc.tensor(np.ones(1, dtype=np.float32), device="cuda")
    function = loader.kernel("elementwise.cu", "binary_vec_kernel", x.dtype)
    raw = driver_launcher(function, 5)
    raw(1, 256, (x.data.ptr, x.data.ptr, out.data.ptr, 1, 0))
    raw_ok = bool(cp.allclose(out, 2 * x))
    rows = [
        ("tensorcore Tensor a + a", lambda: t + t),
        ("tensorcore backend add", lambda: GPU.binary("add", x, x)),
        ("torch add", lambda: tx + tx),
        ("cupy.empty(1)", lambda: cp.empty((1,), dtype=np.float32)),
        ("cupy x + x (CuPy's own kernel)", lambda: x + x),
        ("RawKernel launch, 5 args", lambda: add((1,), (256,), (x, x, out, 1, 0))),
        ("RawKernel launch, numpy scalars", lambda: add((1,), (256,), (x, x, out, n, n))),
        ("Function launch, 5 args", lambda: function((1,), (256,), (x, x, out, 1, 0))),
        ("driver.launchKernel, packed args", lambda: raw(1, 256, (x.data.ptr, x.data.ptr,
                                                                   out.data.ptr, 1, 0))),
        ("cupy.ndarray((1,), float32)", lambda: cp.ndarray((1,), np.float32)),
        ("cupy.empty_like(x)", lambda: cp.empty_like(x)),
        ("x.data.ptr", lambda: x.data.ptr),
        ("x.flags.c_contiguous", lambda: x.flags.c_contiguous),
        ("x._c_contiguous", lambda: x._c_contiguous),
        ("loader.kernel lookup", lambda: loader.kernel("elementwise.cu",
                                                                  "binary_vec_kernel", x.dtype)),
        ("has_kernels(a, b)", lambda: has_kernels(x, x)),
        ("get_current_stream()", cp.cuda.get_current_stream),
    ]
    table = bench_report.Table("Host time per call", ["call", "us"], first=34)
    for name, fn in rows:
        table.row(name, f"{host_us(fn):.2f}")
    bench_report.note(f"driver.launchKernel result correct: {raw_ok}")


if __name__ == "__main__":
    main()
