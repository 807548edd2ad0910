"""CUDA-event timing shared by the GPU benchmark scripts."""

from __future__ import annotations

import statistics

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
