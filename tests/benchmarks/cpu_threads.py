"""CPU thread pools: a small CNN train step under each way a process can be set up.

    python tests/benchmarks/cpu_threads.py [--steps 30] [--blocks 7] [--only NAME ...]

The step: Conv2d 1->16, ReLU, Conv2d 16->32, ReLU, MaxPool2d(2), Flatten,
Linear(512, 10), cross-entropy, Adam, on batches of 64 8x8 images, default backend.
Each configuration runs in a fresh subprocess, because thread pools and the
environment variables that size them are fixed when the libraries load: plain;
torch imported before tensorcore; torch imported after tensorcore;
``tc.set_num_threads(1)``; and, for reference, the environment-variable settings that
used to be the fast path.  In every process the same model in PyTorch runs on the same
batches after tensorcore's steps (torch is imported then if the configuration has not
imported it yet), at torch's default thread count.

Figures are medians over ``--blocks`` blocks of ``--steps`` steps (after warm-up, which
also loads or compiles the Numba kernels).  Each row compares tensorcore's step with
PyTorch's in the same process; the last line compares every row with the fastest
tensorcore row.  No timing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

import bench_report  # tests/benchmarks/bench_report.py

CONFIGS = {
    "plain": {},
    "torch first": {"torch_first": True},
    "torch after tensorcore": {"torch_after": True},
    "tc.set_num_threads(1)": {"threads": 1},
    "torch first, tc.set_num_threads(1)": {"torch_first": True, "threads": 1},
    "env NUMBA_NUM_THREADS=1": {"env": {"NUMBA_NUM_THREADS": "1"}},
    "env OMP_NUM_THREADS=1": {"env": {"OMP_NUM_THREADS": "1"}},
    "env NUMBA_THREADING_LAYER=workqueue": {"env": {"NUMBA_THREADING_LAYER": "workqueue"}},
    "env NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1": {"env": {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}},
}


@dataclass
class Config:
    torch_first: bool = False
    torch_after: bool = False
    threads: int | None = None
    env: dict[str, str] = field(default_factory=dict)


def child(cfg: Config, steps: int, blocks: int) -> dict[str, float | int | str]:
    """Time the step in this process, set up as ``cfg`` says; returns ms per step."""
    import statistics
    import time

    if cfg.torch_first:
        import torch  # noqa: F401
    import numpy as np

    import layers
    import optim
    import tensorcore as tc
    import tensorcore.functional as F

    if cfg.threads is not None:
        tc.set_num_threads(cfg.threads)
    if cfg.torch_after:
        import torch  # noqa: F401, F811

    rng = np.random.default_rng(0)
    xs = rng.standard_normal((4, 64, 1, 8, 8), dtype=np.float32)
    ys = rng.integers(0, 10, (4, 64))

    def median_ms(step) -> float:
        for i in range(steps):  # warm-up (and kernel loading)
            step(i)
        samples = []
        for _ in range(blocks):
            start = time.perf_counter()
            for i in range(steps):
                step(i)
            samples.append((time.perf_counter() - start) / steps * 1e3)
        return statistics.median(samples)

    model = layers.Sequential(layers.Conv2d(1, 16, 3, padding=1), layers.ReLU(),
                              layers.Conv2d(16, 32, 3, padding=1), layers.ReLU(), layers.MaxPool2d(2),
                              layers.Flatten(), layers.Linear(512, 10))
    opt = optim.Adam(model.parameters(), lr=1e-3)
    batches = [(tc.tensor(x), tc.tensor(y)) for x, y in zip(xs, ys)]

    def tc_step(i: int) -> None:
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    tc_ms = median_ms(tc_step)
    threads = tc.get_num_threads()
    from tensorcore.backends.numba.threads import thread_info

    info = thread_info()
    pools = f"{info['numba_layer']}, BLAS on Numba's pool" if info["blas_on_numba_pool"] else \
        f"{info['numba_layer']}, BLAS {[b['num_threads'] for b in info['blas']]} threads"

    import torch  # noqa: F811  (already loaded unless the row leaves torch out until now)

    nn = torch.nn
    tmodel = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                           nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(512, 10))
    topt = torch.optim.Adam(tmodel.parameters(), lr=1e-3)
    tbatches = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in zip(xs, ys)]

    def torch_step(i: int) -> None:
        x, y = tbatches[i % len(tbatches)]
        topt.zero_grad()
        nn.functional.cross_entropy(tmodel(x), y).backward()
        topt.step()

    torch_ms = median_ms(torch_step)
    return {"tc": tc_ms, "torch": torch_ms, "tc_threads": threads, "torch_threads": torch.get_num_threads(),
            "pools": pools}


def run_config(name: str, steps: int, blocks: int) -> dict:
    cfg = Config(**CONFIGS[name])
    env = {**os.environ, **cfg.env}
    out = subprocess.run([sys.executable, __file__, "--child", name, "--steps", str(steps), "--blocks", str(blocks)],
                         env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"configuration {name!r} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="steps per timed block")
    parser.add_argument("--blocks", type=int, default=7, help="timed blocks (the median is reported)")
    parser.add_argument("--only", nargs="*", choices=list(CONFIGS), help="run only these configurations")
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    args = bench_report.parse(parser)
    if args.child:
        print(json.dumps(child(Config(**CONFIGS[args.child]), args.steps, args.blocks)))
        return
    names = args.only or list(CONFIGS)
    table = bench_report.Table(f"{os.cpu_count()} cores; median of {args.blocks} blocks of {args.steps} steps; "
                               "torch at its default threads",
                               ["configuration", "threads", "tc ms", "torch ms", "tc/torch", "pools"], first=42)
    results = {}
    for name in names:
        r = results[name] = run_config(name, args.steps, args.blocks)
        table.row(name, r["tc_threads"], f"{r['tc']:.2f}", f"{r['torch']:.2f}", f"{r['tc'] / r['torch']:.2f}x",
                  r["pools"])
    best = min(results, key=lambda k: results[k]["tc"])
    bench_report.note(f"fastest tensorcore row: {best} ({results[best]['tc']:.2f} ms); each row / fastest: "
          + ", ".join(f"{k} {r['tc'] / results[best]['tc']:.2f}x" for k, r in results.items()))

if __name__ == "__main__":
    main()
