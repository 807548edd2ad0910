"""Where the host time of a compiled call goes on the GPU: the pipeline's replayed DDIM
denoise step and a compiled UNet forward (the reference UNet, [1,4,128,128], TF32).

    TENSORCORE_BACKEND=cupy PYTHONPATH=. python3 tests/benchmarks/replay_host.py

Rows, in microseconds per call (``gpu_timing.host_us``: median of 15 runs of 20
back-to-back calls, the device left to catch up between runs): the whole call; its
cache key (roots and spec); the executor's run with new outputs and with the plan's
own; the CUDA graph's launch alone; the whole call and the run with the launch left
out (the Python around it); then the launch of synthetic straight-line graphs of N
empty kernels, the driver's floor for a graph of that size.  The GPU host's speed
varies from run to run, so each row is measured twice, interleaved, with an empty
Python loop's time printed first as a gauge.  No timing is asserted.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import cupy as cp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_report  # noqa: E402
from gpu_timing import host_us  # noqa: E402

import tensorcore as tc  # noqa: E402
from diffusion import DDIMScheduler, UNet2D  # noqa: E402
from diffusion.pipelines import DiffusionPipeline  # noqa: E402


def loop_ms() -> float:
    """An empty 100 000-step Python loop, in ms: how fast the host runs right now."""
    start = time.perf_counter()
    for _ in range(100_000):
        pass
    return (time.perf_counter() - start) * 1e3


def step_arguments(pipe: DiffusionPipeline, latents: tc.Tensor) -> tuple:
    """The arguments of a real denoise step (a two-step generation records them)."""
    calls, denoiser = [], pipe.denoiser
    pipe.denoiser = lambda *args: calls.append(args) or denoiser(*args)
    try:
        pipe.generate(num_inference_steps=2, latents=latents, progress=False)
    finally:
        pipe.denoiser = denoiser
    return calls[-1]


def synthetic_graph(kernels: int) -> tuple:
    """A captured straight-line graph of ``kernels`` empty kernels and its stream."""
    nop = cp.RawKernel(r'extern "C" __global__ void nop(float* x) { if (x[0] < -1e30f) x[0] = 0; }', "nop")
    buf, stream = cp.zeros(1, dtype=cp.float32), cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        for _ in range(kernels):
            nop((1,), (32,), (buf,))
        graph = stream.end_capture()
    return graph, stream, buf


class _NoLaunch:
    def launch(self, stream: Any) -> None:
        pass


def without_launch(executor: Any, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` with the executor's graph launch left out: the host work around it.  The
    ring of pointer rows is kept from filling, since no launch ever finishes."""
    io = executor.io

    def call() -> object:
        graph, executor.graph = executor.graph, _NoLaunch()
        io.finished_seen = io.submitted
        try:
            return fn()
        finally:
            executor.graph = graph
    return call


def resync(executor: Any) -> None:
    """After rows that launch the graph without filling a pointer row, or fill rows
    without launching: the host's launch count set back to the device's, so the next
    call's launch reads the row that call filled."""
    cp.cuda.Device().synchronize()
    io = executor.io
    io.submitted = io.finished_seen = io.finished.value


def main() -> None:
    bench_report.parse(__doc__)
    tc.manual_seed(0)
    tc.set_matmul_precision("high")
    unet = UNet2D.reference().to("cuda").eval()
    pipe = DiffusionPipeline(unet, DDIMScheduler(), compile=True)
    args = step_arguments(pipe, tc.randn(1, 4, 128, 128, device="cuda"))
    denoiser = pipe.denoiser
    forward = tc.compile(unet)
    latents, timestep = args[2], args[3]
    with tc.no_grad():
        key, _, tensors, _ = denoiser._key(args, {})
        executor = denoiser._plans.get(key).executor
        arrays = [t.data for t in tensors]
        forward(latents, timestep)
        stream = cp.cuda.get_current_stream()
        rows = {
            "DDIM step: whole call": lambda: denoiser(*args),
            "DDIM step: cache key": lambda: denoiser._key(args, {}),
            "DDIM step: run, new outputs": lambda: executor.run(arrays, True),
            "DDIM step: run, plan's outputs": lambda: executor.run(arrays, False),
            "DDIM step: graph launch": lambda: executor.graph.launch(stream),
            "DDIM step: whole call, no launch": without_launch(executor, lambda: denoiser(*args)),
            "DDIM step: run, no launch": without_launch(executor, lambda: executor.run(arrays, True)),
            "UNet forward: whole call": lambda: forward(latents, timestep),
        }
        graphs = {n: synthetic_graph(n) for n in (1, 200, 800)}
        for n, (graph, side, _) in graphs.items():
            rows[f"{n}-kernel graph: launch"] = lambda graph=graph, side=side: graph.launch(side)
        results: dict[str, list[float]] = {name: [] for name in rows}
        gauges = []
        for _ in range(2):
            gauges.append(loop_ms())
            for name, fn in rows.items():
                results[name].append(host_us(fn))
                resync(executor)
    nodes = len(executor.plan.steps)
    table = bench_report.Table(f"DDIM step plan: {nodes} steps, {len(arrays)} inputs; empty 100k loop: "
                               + ", ".join(f"{g:.2f} ms" for g in gauges), ["host us per call", "run 1", "run 2"],
                               first=34)
    for name, values in results.items():
        table.row(name, *(f"{v:.2f}" for v in values))


if __name__ == "__main__":
    main()
