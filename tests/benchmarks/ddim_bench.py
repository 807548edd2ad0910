"""DDIM sampling with the reference UNet, tensorcore against a diffusers-style loop on PyTorch.

    TENSORCORE_BACKEND=cupy python tests/benchmarks/ddim_bench.py             # GPU (H200), TF32
    TENSORCORE_BACKEND=cupy python tests/benchmarks/ddim_bench.py --precision tf32 fp32 bf16 --torch-compile
    python tests/benchmarks/ddim_bench.py --cpu-train --no-gpu                # CPU `train` wall time

GPU part: ``UNet2D.reference()`` (57.6 M parameters) with random weights, saved as a
diffusers folder and loaded by diffusers' ``UNet2DModel``, so both sides run the same
config and weights.  For each precision (``tf32``: TF32 allowed on both sides; ``fp32``:
full float32 matmuls and convolutions on both sides; ``bf16``: both models and the
noise cast to bfloat16, run last):

* the UNet forward at [1, 4, 128, 128]: ours eager and as a compiled CUDA-graph replay,
  PyTorch eager, PyTorch's own CUDA-graph replay, and with ``--torch-compile``
  ``torch.compile(mode="reduce-overhead")`` (inductor + CUDA graphs; its first call
  compiles for a minute or more);
* DDIM sampling over 10 and 50 steps from the same starting noise:
  ``DiffusionPipeline.generate`` eager and compiled (one CUDA graph per step for the
  UNet and the guidance combine), each sync and async, next to the loop of diffusers'
  ``DDIMPipeline`` (``scheduler.step(unet(x, t).sample, t, x)``) with the UNet called
  as PyTorch eager, as a replayed CUDA graph and (opt-in) compiled.

Each figure is the median of several runs after a warm-up; results are compared (max
|difference| against PyTorch eager's images, and compiled against eager).  The host
time of a compiled forward replay and of a replayed DDIM step is printed as wall time
and as the calling thread's CPU time (``gpu_timing.host_times``): the GPU machine's
host is shared, and the second leaves out the time other processes held the core.

``--cpu-train`` times ``python -m diffusion train`` (all defaults, Numba backend, a
fresh output folder) in a subprocess: the README's first command.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.append(".gpu-vendor")  # the GPU machine vendors diffusers here

import numpy as np  # noqa: E402

import bench_report  # noqa: E402  (tests/benchmarks/bench_report.py)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


PRECISIONS = ["tf32", "fp32", "bf16"]
PRECISION_NOTES = {"tf32": "float32 weights, TF32 allowed", "fp32": "full float32",
                   "bf16": "bfloat16 weights and activations"}


def median_ms(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm-up: kernel compilation, memory pools, cuBLAS handles
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), result


def torch_unet_calls(theirs, torch, use_compile: bool) -> dict:
    """The diffusers UNet as ``fn(x, t) -> noise prediction``: PyTorch eager, a captured
    CUDA graph replayed with x and t copied into its static inputs, and (opt-in)
    ``torch.compile(mode="reduce-overhead")``."""
    def eager(x, t):
        return theirs(x, t).sample

    static_x = torch.zeros(1, 4, 128, 128, device="cuda", dtype=next(theirs.parameters()).dtype)
    static_t = torch.zeros((), dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):  # warm-up on a side stream, as torch.cuda.graphs asks
            eager(static_x, static_t)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = eager(static_x, static_t)

    def graphed(x, t):
        static_x.copy_(x)
        static_t.copy_(t)
        graph.replay()
        return static_out

    calls = {"torch eager": eager, "torch graph": graphed}
    if use_compile:
        compiled = torch.compile(theirs, mode="reduce-overhead")
        calls["torch.compile"] = lambda x, t: compiled(x, t.to("cuda")).sample
    return calls


def gpu_rows(steps_list: list[int], repeats: int, precisions: list[str], use_torch_compile: bool) -> None:
    import torch
    from diffusers import DDIMScheduler as TorchDDIM
    from diffusers import UNet2DModel
    from gpu_timing import host_times, queued_ms  # tests/benchmarks/gpu_timing.py

    import tensorcore as tc
    from diffusion import DDIMScheduler, UNet2D
    from diffusion.pipelines import DiffusionPipeline

    tc.manual_seed(0)
    ours = UNet2D.reference().to("cuda").eval()
    with tempfile.TemporaryDirectory() as folder:
        ours.save_pretrained(folder)
        theirs = UNet2DModel.from_pretrained(folder).to("cuda").eval()
    noise = np.random.default_rng(0).standard_normal((1, 4, 128, 128)).astype(np.float32)
    latents, torch_latents = tc.tensor(noise, device="cuda"), torch.tensor(noise, device="cuda")
    for precision in sorted(precisions, key=PRECISIONS.index):  # bf16 last: it casts the weights
        tf32 = precision != "fp32"
        tc.set_matmul_precision("high" if tf32 else "highest")
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        if precision == "bf16":
            ours.to(dtype=tc.bfloat16)
            theirs.to(torch.bfloat16)
            latents, torch_latents = latents.to(dtype=tc.bfloat16), torch_latents.to(torch.bfloat16)
        bench_report.note(f"{precision}: {PRECISION_NOTES[precision]} on both sides ({repeats} runs, median)")
        forward_rows(ours, theirs, latents, torch_latents, tc, torch, queued_ms, host_times, use_torch_compile)
        compiled = ddim_rows(ours, theirs, latents, torch_latents, tc, torch, steps_list, repeats,
                             use_torch_compile, DiffusionPipeline, DDIMScheduler, TorchDDIM)
        step_host_row(compiled, latents, tc, host_times)


def forward_rows(ours, theirs, latents, torch_latents, tc, torch, queued_ms, host_times, use_torch_compile: bool) -> None:
    """One UNet forward, CUDA-event time per call, five ways; the host time of a replay."""
    t, torch_t = tc.tensor([500.0], device="cuda"), torch.tensor(500, device="cuda")
    compiled = tc.compile(ours, cache_dir=False)
    with tc.no_grad(), torch.no_grad():
        timed = functools.partial(queued_ms, calls=5, reps=5)
        rows = {"ours eager": timed(lambda: ours(latents, t)), "ours compiled": timed(lambda: compiled(latents, t))}
        host = host_times(lambda: compiled(latents, t))
        for name, call in torch_unet_calls(theirs, torch, use_torch_compile).items():
            rows[name] = timed(lambda call=call: call(torch_latents, torch_t))
        difference = float(np.abs(compiled(latents, t).numpy().astype(np.float32)
                                - theirs(torch_latents, torch_t).sample.float().cpu().numpy()).max())
    compiled.release()
    table = bench_report.Table("UNet forward [1,4,128,128] (> 1: ours compiled faster)",
                               ["run", "ms per call", "its time / ours compiled"], first=16)
    for name, ms in rows.items():
        table.row(name, f"{ms:.2f}", f"{ms / rows['ours compiled']:.2f}x")
    bench_report.note(f"max |ours compiled - torch eager| {difference:.2e}; host time per compiled UNet forward "
                      f"replay: {host[0]:.1f} us ({host[1]:.1f} us of thread CPU time)")


def step_host_row(pipe, latents, tc, host_times) -> None:
    """The host time of one replayed DDIM step: the compiled pipeline's denoise step (UNet,
    scheduler update, non-finite guard: one CUDA graph, its plan already made by the DDIM
    rows) called with the arguments of a real step."""
    from replay_host import step_arguments  # tests/benchmarks/replay_host.py

    denoiser, args = pipe.denoiser, step_arguments(pipe, latents)
    with tc.no_grad():
        host = host_times(lambda: denoiser(*args))
    info = denoiser.cache_info()
    bench_report.note(f"host time per replayed DDIM step (compiled denoise step): {host[0]:.1f} us "
          f"({host[1]:.1f} us of thread CPU time; {info.hits} replays, {info.traces} traces, "
          f"{info.fallbacks} eager fallbacks)")


def ddim_rows(ours, theirs, latents, torch_latents, tc, torch, steps_list, repeats, use_torch_compile,
              DiffusionPipeline, DDIMScheduler, TorchDDIM) -> Any:
    """DDIM generate at each step count: ours eager/compiled (sync, async), PyTorch's loop;
    returns the compiled pipeline."""
    pipe = DiffusionPipeline(ours, DDIMScheduler(), compile=False)
    compiled = DiffusionPipeline(ours, DDIMScheduler(), compile=True)
    reference_scheduler = TorchDDIM()
    torch_calls = torch_unet_calls(theirs, torch, use_torch_compile)

    def ours_sync(steps: int, pipe=pipe):
        images = pipe.generate(num_inference_steps=steps, latents=latents, progress=False).images
        tc.cuda.synchronize()
        return images

    def ours_async(steps: int, pipe=pipe):
        return asyncio.run(pipe.generate_async(num_inference_steps=steps, latents=latents, progress=False)).images

    def torch_loop(steps: int, unet_call):
        reference_scheduler.set_timesteps(steps)
        x = torch_latents
        with torch.no_grad():
            for t in reference_scheduler.timesteps:
                x = reference_scheduler.step(unet_call(x, t), t, x, eta=0.0).prev_sample
            images = (x / 2 + 0.5).clamp(0, 1)
        torch.cuda.synchronize()
        return images

    names = ["eager", "async", "compiled", "c. async", *torch_calls]
    table = bench_report.Table("DDIM generate [1,4,128,128], ms (compiled against eager and torch: speed-ups)",
                               ["steps", *names, "compiled ms/step", "vs our eager", "vs torch eager",
                                "vs torch graph", "max diff torch", "max diff compiled-eager"])
    for steps in steps_list:
        times, images = {}, {}
        times["eager"], images["eager"] = median_ms(lambda: ours_sync(steps), repeats)
        times["async"], images["async"] = median_ms(lambda: ours_async(steps), repeats)
        times["compiled"], images["compiled"] = median_ms(lambda: ours_sync(steps, compiled), repeats)
        times["c. async"], images["c. async"] = median_ms(lambda: ours_async(steps, compiled), repeats)
        for name, call in torch_calls.items():
            times[name], images[name] = median_ms(lambda call=call: torch_loop(steps, call), repeats)
        assert np.array_equal(images["eager"].numpy(), images["async"].numpy()), "async differs from sync"
        assert np.array_equal(images["compiled"].numpy(), images["c. async"].numpy()), "compiled async differs"
        diff = float(np.abs(images["eager"].numpy() - images["torch eager"].float().cpu().numpy()).max())
        compiled_diff = float(np.abs(images["eager"].numpy() - images["compiled"].numpy()).max())
        table.row(steps, *(f"{times[n]:.1f}" for n in names), f"{times['compiled'] / steps:.2f}",
                  *(f"{times[n] / times['compiled']:.2f}x" for n in ("eager", "torch eager", "torch graph")),
                  f"{diff:.2e}", f"{compiled_diff:.2e}")
    return compiled


def cpu_train_seconds() -> float:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "TENSORCORE_BACKEND": "numba", "PYTHONPATH": REPO}
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "diffusion", "train", "--out", os.path.join(folder, "run"),
                        "--no-progress"], check=True, env=env, cwd=folder)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 50], help="DDIM step counts")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per figure")
    parser.add_argument("--cpu-train", action="store_true", help="also time `python -m diffusion train` on the CPU")
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU rows")
    parser.add_argument("--precision", nargs="+", choices=PRECISIONS, default=["tf32"],
                        help="matmul/convolution precisions to run, each on both sides")
    parser.add_argument("--torch-compile", action="store_true",
                        help='add torch.compile(mode="reduce-overhead") rows (compiles for minutes)')
    args = bench_report.parse(parser)
    if not args.no_gpu:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        gpu_rows(args.steps, args.repeats, args.precision, args.torch_compile)
    if args.cpu_train:
        seconds = cpu_train_seconds()
        bench_report.note(f"python -m diffusion train (defaults, numba backend, {os.cpu_count()} CPU cores): "
              f"{seconds:.1f} s wall ({seconds / 60:.2f} min)")


if __name__ == "__main__":
    main()
