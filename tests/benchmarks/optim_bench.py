"""Optimizer step time: tensorcore's flat-buffer Adam/AdamW against torch.optim.

    PYTHONPATH=. python3 tests/benchmarks/optim_bench.py                  # CPU, 2 threads
    PYTHONPATH=. python3 tests/benchmarks/optim_bench.py --device cuda    # GPU

CPU: Adam over 10 M float32 parameters in 100 tensors, against torch's foreach (and
fused) Adam, everything on 2 threads (``--threads``).  GPU: Adam and AdamW over 100 M float32
parameters in 200 tensors, eager and replayed as a CUDA graph, against torch's fused
and foreach implementations, timed with CUDA events.  Every figure is the median
step time; GB/s counts the 28 bytes an Adam step moves per parameter (read p, g, m,
v; write p, m, v).  Gradients stay in place between steps (zero_grad(set_to_none=
False) training loop), as in torch.  Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

import bench_report  # tests/benchmarks/bench_report.py

BYTES_PER_PARAM = 28
COLUMNS = ["implementation", "step ms", "GB/s"]


def _cpu_threads(n: int) -> None:
    for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, str(n))


def _sizes(total: int, count: int) -> list[int]:
    """``count`` tensor sizes summing to ``total``, uneven like a real model's."""
    weights = [1 + (i * 7919) % 13 for i in range(count)]
    sizes = [total * w // sum(weights) for w in weights]
    sizes[0] += total - sum(sizes)
    return sizes


def _median_ms(run: Callable[[], None], repeats: int, timer: Callable[[Callable[[], None]], float]) -> float:
    for _ in range(3):
        run()
    return statistics.median(timer(run) for _ in range(repeats))


def _host_timer(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1e3


def _ours(name: str, sizes: list[int], device: str) -> tuple[Any, list[Any]]:
    import numpy as np

    import optim
    import tensorcore as tc
    from layers.parameter import Parameter

    rng = np.random.default_rng(0)
    params = [Parameter(tc.tensor(rng.standard_normal(n, dtype=np.float32), device=device)) for n in sizes]
    for p, n in zip(params, sizes):
        p.grad = tc.tensor(rng.standard_normal(n, dtype=np.float32) * 1e-2, device=device)
    opt = getattr(optim, name)(params, lr=1e-3, weight_decay=1e-2)
    opt.zero_grad(set_to_none=False)  # packs the buffers: grads become views of the flat buffer
    for p in params:
        p.grad.data[...] = 1e-2
    return opt, params


def _theirs(name: str, sizes: list[int], device: str, impl: str) -> Any:
    import torch

    params = [torch.randn(n, device=device, requires_grad=True) for n in sizes]
    for p in params:
        p.grad = torch.full_like(p, 1e-2)
    flag = {"fused": dict(fused=True), "foreach": dict(foreach=True)}[impl]
    return getattr(torch.optim, name)(params, lr=1e-3, weight_decay=1e-2, **flag)


def _row(label: str, ms: float, n: int, reference_ms: float | None) -> list[str]:
    """The cells of one implementation's row: step time, bandwidth, time / the reference's."""
    gbs = BYTES_PER_PARAM * n / (ms * 1e-3) / 1e9
    return [label, f"{ms:.3f}", f"{gbs:.1f}", f"{ms / reference_ms:.2f}x" if reference_ms else ""]


def bench_cpu(total: int, count: int, repeats: int, threads: int) -> None:
    import torch

    import tensorcore as tc

    torch.set_num_threads(threads)
    sizes = _sizes(total, count)
    backend = tc.get_backend().name
    title = (f"CPU: Adam over {total / 1e6:.0f} M float32 parameters in {count} tensors, {threads} threads, "
             f"tensorcore backend {backend!r}, torch {torch.__version__}")
    timings = {}
    for impl in ("foreach", "fused"):
        try:
            opt = _theirs("Adam", sizes, "cpu", impl)
        except (RuntimeError, ValueError) as exc:
            bench_report.note(f"torch Adam {impl}: unavailable ({exc})")
            continue
        timings[impl] = _median_ms(opt.step, repeats, _host_timer)
    ours, _ = _ours("Adam", sizes, "cpu")
    timings["ours"] = _median_ms(ours.step, repeats, _host_timer)
    reference = timings.get("foreach")
    table = bench_report.Table(title, COLUMNS + ["vs torch foreach"], first=34)
    for impl in ("foreach", "fused"):
        if impl in timings:
            table.row(*_row(f"torch Adam ({impl})", timings[impl], total, reference))
    table.row(*_row(f"tensorcore Adam ({backend})", timings["ours"], total, reference))


def _cuda_timer(run: Callable[[], None]) -> float:
    import cupy

    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    run()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop)


def _replay_ms(step: Callable[[], None], repeats: int) -> float:
    """Median time of ``step`` captured once into a CUDA graph and replayed."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        step()  # warm up (kernel compilation) outside the capture
        stream.synchronize()
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        return _median_ms(lambda: graph.launch(stream), repeats, _cuda_timer)  # events on this stream


def _torch_cuda_timer(run: Callable[[], None]) -> float:
    import torch

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop)


def bench_cuda(total: int, count: int, repeats: int) -> None:
    import cupy

    sizes = _sizes(total, count)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    title = f"GPU ({name}): Adam/AdamW over {total / 1e6:.0f} M float32 parameters in {count} tensors"
    try:
        import torch
        has_torch = torch.cuda.is_available()
    except ImportError:
        has_torch = False
    if not has_torch:
        bench_report.note("torch with CUDA is not installed here: no torch reference rows")
    table = bench_report.Table(title, COLUMNS + ["vs torch fused"], first=34)
    for name in ("Adam", "AdamW"):
        reference = None
        if has_torch:
            for impl in ("fused", "foreach"):
                opt = _theirs(name, sizes, "cuda", impl)
                ms = _median_ms(opt.step, repeats, _torch_cuda_timer)
                reference = reference or ms
                table.row(*_row(f"torch {name} ({impl})", ms, total, reference))
                del opt
                torch.cuda.empty_cache()
        ours, params = _ours(name, sizes, "cuda")
        table.row(*_row(f"tensorcore {name} (eager)", _median_ms(ours.step, repeats, _cuda_timer), total, reference))
        table.row(*_row(f"tensorcore {name} (CUDA graph)", _replay_ms(ours.step, repeats), total, reference))
        del ours, params
        cupy.get_default_memory_pool().free_all_blocks()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--params", type=float, default=None, help="total parameters (default 10 M CPU, 100 M GPU)")
    parser.add_argument("--tensors", type=int, default=None, help="tensor count (default 100 CPU, 200 GPU)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for both libraries")
    args = bench_report.parse(parser, argv)
    if args.device == "cpu":
        _cpu_threads(args.threads)
        bench_cpu(int(args.params or 10e6), args.tensors or 100, args.repeats, args.threads)
    else:
        bench_cuda(int(args.params or 100e6), args.tensors or 200, args.repeats)


if __name__ == "__main__":
    sys.exit(main())
