"""Per-op overhead and a small MLP step: tensorcore (numpy backend) vs PyTorch CPU.

    TENSORCORE_BACKEND=numpy python tests/benchmarks/cpu_overhead.py

Prints microseconds per call (median of repeated timings) and the ratio to torch.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import tensorcore as tc
import tensorcore.functional as F

import numpy as np  # noqa: E402

import bench_report  # noqa: E402  (tests/benchmarks/bench_report.py)
import layers  # noqa: E402
import optim  # noqa: E402


def median_time(fn: Callable[[], object], repeat: int, number: int) -> float:
    """Median seconds per call over ``repeat`` timings of ``number`` calls."""
    fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples)


def tensorcore_cases() -> dict[str, Callable[[], object]]:
    a, b = tc.randn(4), tc.randn(4)
    ga, gb = tc.randn(4, requires_grad=True), tc.randn(4, requires_grad=True)
    rng = np.random.default_rng(0)
    x = tc.tensor(rng.standard_normal((256, 784), dtype=np.float32))
    y = tc.tensor(rng.integers(0, 10, 256))
    model = layers.Sequential(layers.Linear(784, 512), layers.ReLU(), layers.Linear(512, 512),
                              layers.ReLU(), layers.Linear(512, 10))
    opt = optim.SGD(model.parameters(), lr=0.01)

    def tiny_fwd_bwd() -> None:
        (ga * gb + ga).sum().backward()

    def mlp_step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return {"tiny add (per op)": lambda: a + b, "tiny (a*b+a).sum() fwd+bwd": tiny_fwd_bwd, "MLP 784-512-512-10 b256 SGD step": mlp_step}


def torch_cases(torch) -> dict[str, Callable[[], object]]:
    a, b = torch.randn(4), torch.randn(4)
    ga, gb = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    x, y = torch.randn(256, 784), torch.randint(0, 10, (256,))
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def tiny_fwd_bwd() -> None:
        (ga * gb + ga).sum().backward()

    def mlp_step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return {"tiny add (per op)": lambda: a + b, "tiny (a*b+a).sum() fwd+bwd": tiny_fwd_bwd, "MLP 784-512-512-10 b256 SGD step": mlp_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    args = bench_report.parse(parser)
    ours = tensorcore_cases()
    try:
        import torch

        torch.set_num_threads(args.threads)
        theirs = torch_cases(torch)
    except ImportError:
        theirs = {}
    table = bench_report.Table(f"backend={tc.get_backend().name}  torch={'yes' if theirs else 'not installed'}",
                               ["work", "tensorcore us", "torch us", "ratio"], first=34)
    for name, fn in ours.items():
        number = 2000 if "tiny" in name else 10
        t_ours = median_time(fn, 7, number)
        t_theirs = median_time(theirs[name], 7, number) if name in theirs else float("nan")
        table.row(name, f"{t_ours * 1e6:.1f}", f"{t_theirs * 1e6:.1f}", f"{t_ours / t_theirs:.2f}x")


if __name__ == "__main__":
    main()
