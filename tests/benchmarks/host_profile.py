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
from tensorcore.backends import cuda_loader
from tensorcore.backends.cupy_backend import CupyBackend
from tensorcore.backends.cupy_util import has_kernels

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


def main() -> None:
    x = cp.random.standard_normal(1, dtype=np.float32)
    tx = torch.from_dlpack(x.copy())
    add = cuda_loader.raw_kernel("elementwise.cu", "binary_vec_kernel", x.dtype)
    out = cp.empty_like(x)
    n = np.int64(1)
    t = tc.tensor(np.ones(1, dtype=np.float32), device="cuda")
    function = cuda_loader.kernel("elementwise.cu", "binary_vec_kernel", x.dtype)
    rows = [
        ("tensorcore Tensor a + a", lambda: t + t),
        ("tensorcore backend add", lambda: GPU.binary("add", x, x)),
        ("torch add", lambda: tx + tx),
        ("cupy.empty(1)", lambda: cp.empty((1,), dtype=np.float32)),
        ("cupy x + x (CuPy's own kernel)", lambda: x + x),
        ("RawKernel launch, 5 args", lambda: add((1,), (256,), (x, x, out, 1, 0))),
        ("RawKernel launch, numpy scalars", lambda: add((1,), (256,), (x, x, out, n, n))),
        ("Function launch, 5 args", lambda: function((1,), (256,), (x, x, out, 1, 0))),
        ("cuda_loader.kernel lookup", lambda: cuda_loader.kernel("elementwise.cu",
                                                                  "binary_vec_kernel", x.dtype)),
        ("has_kernels(a, b)", lambda: has_kernels(x, x)),
        ("get_current_stream()", cp.cuda.get_current_stream),
    ]
    for name, fn in rows:
        print(f"{name:34s} {host_us(fn):7.2f} us")


if __name__ == "__main__":
    main()
