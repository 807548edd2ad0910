"""Native plans on the Numba backend: the tiny MLP's forward and Adam step, eager against
the compiled replay as a Python loop of steps (TENSORCORE_NATIVE_PLANS=0) and as native
segments, and the host time of a native replay by part.

    PYTHONPATH=. python tests/benchmarks/native_plan_bench.py

The three variants take turns, ``--rounds`` rounds of ``--number`` calls each, so a
shared machine's drift falls on all alike; medians of the rounds, wall / process CPU
time in microseconds per call.  Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import tensorcore as tc  # first: its settings tune BLAS thread waits before NumPy loads
import tensorcore.functional as F

import optim  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_bench import tiny_mlp  # noqa: E402


def compiled(fn: Callable, native: bool) -> Callable:
    """``fn`` compiled, its plan bound with native plans on or off, warmed up."""
    os.environ["TENSORCORE_NATIVE_PLANS"] = "1" if native else "0"
    try:
        run = tc.compile(fn, cache_dir=False)
        for _ in range(5):
            run()
    finally:
        del os.environ["TENSORCORE_NATIVE_PLANS"]
    return run


def alternate(variants: dict[str, Callable], rounds: int, number: int) -> dict[str, tuple[float, float]]:
    kept: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(number):
                fn()
            kept[name].append(((time.perf_counter() - start) / number * 1e6,
                               (time.process_time() - start_cpu) / number * 1e6))
    return {name: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v)) for name, v in kept.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=200)
    args = parser.parse_args()
    with tc.use_backend("numba"):
        model = tiny_mlp().eval()
        x = tc.randn(2, 16)
        forward = lambda: model(x)  # noqa: E731
        with tc.no_grad():
            cases = {"forward (no_grad)": {"eager": forward, "python loop": compiled(forward, False),
                                           "native": compiled(forward, True)}}
            report("tiny MLP forward", alternate(cases["forward (no_grad)"], args.rounds, args.number))
            host_parts(cases["forward (no_grad)"]["native"])
        opt = optim.Adam(model.parameters(), lr=1e-3)
        target = tc.randn(2, 4)

        def step() -> tc.Tensor:
            opt.zero_grad()
            loss = F.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            return loss

        report("tiny MLP Adam step", alternate({"eager": step, "python loop": compiled(step, False),
                                                "native": compiled(step, True)}, args.rounds, args.number))


def report(title: str, times: dict[str, tuple[float, float]]) -> None:
    eager = times["eager"]
    print(f"{title} (us per call, wall / CPU):")
    for name, (wall, cpu) in times.items():
        print(f"  {name:12s} {wall:8.1f} / {cpu:8.1f}   {eager[0] / wall:5.2f}x / {eager[1] / cpu:5.2f}x of eager")


def host_parts(run: tc.compile) -> None:
    """The parts of a native replay: the cache key, the guards, the executor's run
    (input copy, segments, output copy) and the segments alone."""
    (entry,) = run._plans.values()
    parts = {"whole call": run, "key": lambda: run._key((), {}), "guards": entry.holds,
             "executor run": lambda: entry.executor.run([]),
             "segments": lambda: [step() for step in entry.executor.steps]}
    times = alternate(parts, 9, 500)
    print("  native replay by part (us, CPU): " + ", ".join(f"{k} {v[1]:.1f}" for k, v in times.items()))


if __name__ == "__main__":
    main()
