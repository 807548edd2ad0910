"""CUDA-event timing shared by the GPU benchmark scripts."""

from __future__ import annotations

import statistics
import time

import cupy as cp


def graph_ms(fn, iters: int = 40) -> float:
    """Median time in ms of replaying a CUDA graph captured from one call of ``fn`` on
    a non-blocking stream (after three warm-up calls that compile kernels, create
    handles and fill the memory pool for that stream)."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for _ in range(3):
            fn()
        stream.synchronize()
        stream.begin_capture()
        kept = fn()  # outputs stay alive while the graph is replayed
        graph = stream.end_capture()
        for _ in range(3):
            graph.launch(stream)
        times = []
        for _ in range(iters):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop))
    del kept
    return statistics.median(times)


def event_ms(fn, iters: int = 40, warmup: int = 5) -> float:
    """Median of per-call CUDA-event times (the events go on CuPy's current stream, which
    is the legacy default stream that PyTorch also uses, so this times either side)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def torch_graph(fn):
    """``fn`` captured in a torch CUDA graph, warmed up on a side stream as torch.cuda.graphs
    asks: (the graph's replay, the graph's static output, kept alive by the caller)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kept = fn()
    return graph.replay, kept


def queued_ms(fn, calls: int = 20, reps: int = 15) -> float:
    """Median over ``reps`` of (time of ``calls`` back-to-back calls) / calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / calls)
    return statistics.median(times)


def host_times(fn, number: int = 20, runs: int = 15) -> tuple[float, float]:
    """Median host microseconds per call of ``fn`` over ``runs`` runs of ``number``
    back-to-back calls, the device left to catch up between runs (so no call waits on a
    full queue): wall time, and the calling thread's CPU time (what the call itself
    costs the host, less the time other processes took the core from it)."""
    sync = cp.cuda.Device().synchronize
    wall, cpu = [], []
    for _ in range(runs):
        sync()
        start, start_cpu = time.perf_counter(), time.thread_time()
        for _ in range(number):
            fn()
        wall.append((time.perf_counter() - start) / number * 1e6)
        cpu.append((time.thread_time() - start_cpu) / number * 1e6)
    sync()
    return statistics.median(wall), statistics.median(cpu)


def host_us(fn, number: int = 20, runs: int = 15) -> float:
    """``host_times``' wall time alone."""
    return host_times(fn, number, runs)[0]
