"""tc.compile against eager mode: per-call time of compiled replays, start-up from the disk cache.

    python tests/benchmarks/compile_bench.py                          # the CPU figures
    TENSORCORE_BACKEND=cupy python tests/benchmarks/compile_bench.py  # also the GPU figures
    TENSORCORE_BACKEND=cupy python tests/benchmarks/compile_bench.py --gpu-only   # the GPU figures alone

CPU: the tiny MLP (2x16 -> 32 -> 32 -> 4, SiLU/GELU) forward on each CPU backend, eager
(no_grad, and with autograd recording) against the compiled replay; an Adam train step
of the same MLP; the digits ``train`` step of the command line (Numba, ``compile=False``
against ``compile=True``); the first call of a new process that traces against one that loads
the plan from the disk cache.  GPU (TENSORCORE_BACKEND=cupy): the same MLP, then the
reference UNet (``diffusion.UNet2D.reference()``, input [1, 4, 128, 128]) forward and an
AdamW train step, eager against the compiled CUDA-graph replay, with the host time per
replay.  Times are medians; device times are CUDA-event times of back-to-back calls.
Nothing is asserted: the figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import tensorcore as tc  # first: its settings tune BLAS thread waits before NumPy loads
import tensorcore.functional as F

import layers  # noqa: E402
import optim  # noqa: E402
import bench_report  # noqa: E402  (tests/benchmarks/bench_report.py)

REPO = Path(__file__).resolve().parents[2]


def median_us(fn: Callable[[], object], repeat: int = 15, number: int = 200) -> tuple[float, float]:
    """Median microseconds per call over ``repeat`` timings of ``number`` calls: wall
    time, and the process's CPU time (less disturbed when other jobs share the cores)."""
    for _ in range(20):
        fn()
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(number):
            fn()
        wall.append((time.perf_counter() - start) / number * 1e6)
        cpu.append((time.process_time() - start_cpu) / number * 1e6)
    return statistics.median(wall), statistics.median(cpu)


def tiny_mlp(device: str | None = None) -> layers.Module:
    tc.manual_seed(0)
    model = layers.Sequential(layers.Linear(16, 32), layers.SiLU(), layers.Linear(32, 32), layers.GELU(),
                              layers.Linear(32, 4))
    return model.to(device) if device else model


def mlp_rows(backend: str, device: str | None = None, sync: Callable[[], None] = lambda: None) -> list[tuple]:
    """(case, eager, compiled) times in us for the tiny MLP forward and Adam step."""
    model = tiny_mlp(device).eval()
    compiled = tc.compile(model, cache_dir=False)
    x = tc.randn(2, 16, device=device)

    def timed(fn: Callable[[], object]) -> tuple[float, float]:
        return median_us(lambda: (fn(), sync()))

    with tc.no_grad():
        eager = timed(lambda: model(x))
        replay = timed(lambda: compiled(x))
    eager_grad = timed(lambda: model(x))
    rows = [(f"tiny MLP forward, {backend}", eager, replay), ("  eager recording autograd", eager_grad, replay)]
    opt = optim.Adam(model.parameters(), lr=1e-3)
    target = tc.randn(2, 4, device=device)

    def step() -> tc.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        return loss

    step_compiled = tc.compile(step, cache_dir=False)
    rows.append((f"tiny MLP Adam step, {backend}", timed(step), timed(step_compiled)))
    return rows


def digits_train_row(backend: str, rounds: int = 8, per_round: int = 5, warmup: int = 10) -> tuple:
    """(case, eager, compiled, convolutions) ms per step of the CLI's default ``train``
    step: the digits UNet (levels 32, 64) on batches of 64 8x8 digits, AdamW, clipping,
    EMA.  An eager and a compiled trainer take turns, ``per_round`` steps each for
    ``rounds`` rounds after ``warmup`` steps each, so that a shared machine's drift from
    minute to minute falls on both alike; the median round (wall, process CPU time).
    "convolutions" runs the compiled plan's convolution kernels alone (forward and both
    gradients, as the plan calls them), in the same rounds: the same kernels run in
    eager mode, so eager / convolutions bounds what any plan built on them can gain."""
    from diffusion import DDPMScheduler, UNet2D
    from diffusion.cli.digits import unet_config
    from diffusion.datasets import digit_images
    from diffusion.training import ddpm_trainer

    data = digit_images(8)
    trainers = []
    for mode in (False, True):
        tc.manual_seed(0)
        unet = UNet2D(**unet_config(8, (32, 64), 1, 1)).train()
        trainers.append(ddpm_trainer(unet, DDPMScheduler(beta_schedule="squaredcos_cap_v2"), data,
                                     steps=warmup + rounds * per_round, batch_size=64, grad_clip=1.0,
                                     ema_decay=0.999, checkpoint_every=None, progress=False, compile=mode))
    for trainer in trainers:
        for _ in range(warmup):
            trainer.train_step()
    if backend == "numba":
        from tensorcore.backends.numba import native_plan

        native_plan.wait()  # a plan's native segments compile in the background on a cold cache
    runs = [trainer.train_step for trainer in trainers] + [convolution_steps(trainers[1])]
    times: list[list[tuple[float, float]]] = [[] for _ in runs]
    for _ in range(rounds):
        for run, kept in zip(runs, times):
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(per_round):
                run()
            kept.append(((time.perf_counter() - start) / per_round * 1e3,
                         (time.process_time() - start_cpu) / per_round * 1e3))
    info = trainers[1].compile_info
    assert info.hits >= rounds * per_round, info
    medians = [tuple(statistics.median(t[i] for t in kept) for i in (0, 1)) for kept in times]
    return (f"digits train step (CLI default), {backend}", *medians)


def convolution_steps(trainer: Any) -> Callable[[], None]:
    """The convolution steps of a compiled trainer's plan, called in order on the
    plan's own buffers (what its last step left there)."""
    (entry,) = trainer._compiled_step._plans.values()
    nodes, executor = entry.plan.graph.nodes, entry.executor
    steps = [step for position, step in zip(entry.plan.steps, executor.python_steps)
             if nodes[position].op.startswith("conv2d")]

    def run() -> None:
        for step in steps:
            step()
    return run


STARTUP = """
import json, sys, time
import tensorcore as tc, layers
tc.manual_seed(0)
model = layers.Sequential(layers.Conv2d(4, 32, 3, padding=1), layers.GroupNorm(8, 32), layers.SiLU(),
                          layers.Conv2d(32, 32, 3, padding=1), layers.GroupNorm(8, 32), layers.SiLU(),
                          layers.Conv2d(32, 4, 3, padding=1)).eval()
x = tc.randn(1, 4, 32, 32)
with tc.no_grad():
    model(x)  # kernels compiled or loaded first: the first compiled call measures only trace or load
    compiled = tc.compile(model, cache_dir=sys.argv[1])
    start = time.perf_counter()
    compiled(x)
    first = time.perf_counter() - start
print(json.dumps({"first_ms": first * 1e3, "traces": compiled.cache_info().traces,
                  "disk_loads": compiled.cache_info().disk_loads}))
"""


def startup() -> None:
    """First compiled call in a new process: traced, then loaded from the disk cache."""
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        runs = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", STARTUP, cache_dir], env=env, capture_output=True,
                                 text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    traced, loaded = runs
    assert traced["traces"] == 1 and loaded["disk_loads"] == 1, runs
    bench_report.note(f"first call in a new process (small CNN, kernels warm): traced {traced['first_ms']:.1f} ms, "
          f"plan loaded from disk {loaded['first_ms']:.1f} ms: {traced['first_ms'] - loaded['first_ms']:.1f} ms saved")


def print_rows(title: str, rows: list[tuple], unit: str = "us") -> None:
    """Rows of (case, eager, compiled), each time a number or a (wall, cpu) pair."""
    table = bench_report.Table(title, ["case", "eager " + unit, "compiled " + unit, "speed-up"], first=44)
    for case, eager, compiled in rows:
        eager, compiled = (eager if isinstance(eager, tuple) else (eager,)), (compiled if isinstance(compiled, tuple) else (compiled,))
        table.row(case, " / ".join(f"{v:.1f}" for v in eager), " / ".join(f"{v:.1f}" for v in compiled),
                  " / ".join(f"{e / c:.2f}x" for e, c in zip(eager, compiled)))


def cpu_section() -> None:
    rows, train_rows = [], []
    for name in ("numpy", "numba"):
        try:
            with tc.use_backend(name):
                rows += mlp_rows(name)
                if name == "numba":  # the command line's fast backend
                    train_rows.append(digits_train_row(name))
        except RuntimeError as exc:  # numba not installed
            bench_report.note(f"({name}: {exc})")
    print_rows("CPU, per call (wall / process CPU time)", rows)
    print_rows("CPU, per training step (wall / process CPU time)", [row[:3] for row in train_rows], unit="ms")
    for case, eager, _, convolutions in train_rows:
        bench_report.note(f"{case}: its plan's convolution kernels alone {convolutions[0]:.1f} ms, so a plan "
              f"that ran nothing else would be {eager[0] / convolutions[0]:.2f}x faster than eager")
    startup()


# ----- GPU ---------------------------------------------------------------------------------
def gpu_section() -> None:
    import cupy as cp

    from gpu_timing import host_us, queued_ms

    sync = cp.cuda.Device().synchronize
    print_rows("GPU tiny MLP, per call synchronized (wall / process CPU time)", mlp_rows("cupy", "cuda", sync))
    try:
        from diffusion import UNet2D

        unet = UNet2D.reference().to("cuda").eval()
    except (ImportError, AttributeError) as exc:
        bench_report.note(f"reference UNet unavailable ({exc}); skipping the UNet figures")
        return
    x = tc.randn(1, 4, 128, 128, device="cuda")
    t = tc.tensor([500.0], device="cuda")
    compiled = tc.compile(unet, cache_dir=False)
    with tc.no_grad():
        eager_ms = queued_ms(lambda: unet(x, t))
        compiled(x, t)  # trace and capture
        replay_ms = queued_ms(lambda: compiled(x, t))
        host = host_us(lambda: compiled(x, t))
    print_rows("GPU reference UNet forward (CUDA-event time per call)",
               [("UNet forward [1,4,128,128] fp32", eager_ms, replay_ms)], unit="ms")
    bench_report.note(f"host time per forward replay: {host:.1f} us ({host_parts(compiled, (x, t))})")
    static = tc.compile(unet, cache_dir=False, reuse_outputs=True)  # outputs are the plan's buffers
    with tc.no_grad():
        static(x, t)
        host_static = host_us(lambda: static(x, t))
    bench_report.note(f"host time per forward replay with reuse_outputs=True: {host_static:.1f} us")
    static.release()
    opt = optim.AdamW(unet.parameters(), lr=1e-5)
    noise = tc.randn(1, 4, 128, 128, device="cuda")
    unet.train()

    def step() -> tc.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(unet(x, t), noise)
        loss.backward()
        opt.step()
        return loss

    step_compiled = tc.compile(step, cache_dir=False)
    eager_step = queued_ms(step, calls=5, reps=5)
    for _ in range(3):
        step_compiled()  # settles: the optimizer packs its buffers on its first step
    replay_step = queued_ms(step_compiled, calls=5, reps=5)
    host_step = host_us(step_compiled, number=5)
    print_rows("GPU reference UNet train step (CUDA-event time per call)",
               [("UNet AdamW train step", eager_step, replay_step)], unit="ms")
    bench_report.note(f"host time per train-step replay: {host_step:.1f} us "
          f"(forward plans: {compiled.cache_info().plans}, train step {step_compiled.cache_info()})")


def host_parts(compiled: Any, args: tuple) -> str:
    """The host time of one replay split by stage (us each): the cache key, the guards,
    the graph launch with its input and output copies, and the same with the plan's
    own output buffers returned."""
    from gpu_timing import host_us

    entry = next(iter(compiled._plans.values()))
    arrays = [a.data for a in args]
    parts = {"key": lambda: compiled._key(args, {}), "guards": entry.holds,
             "launch with copies": lambda: entry.executor.run(arrays),
             "launch, outputs kept": lambda: entry.executor.run(arrays, False)}
    return ", ".join(f"{name} {host_us(fn):.1f}" for name, fn in parts.items())


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu-only", action="store_true",
                        help="skip the CPU rows, which take a while (on a timed GPU run)")
    if not bench_report.parse(parser).gpu_only:
        cpu_section()
    if tc.get_backend().name == "cupy":
        gpu_section()
