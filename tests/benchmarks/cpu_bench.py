"""CPU kernels and train steps: Numba backend vs NumPy backend vs PyTorch CPU.

    python tests/benchmarks/cpu_bench.py [--threads 2] [--repeat 15]

Every case runs on all three in one process, each timed as the best of ``--repeat``
runs (the least disturbed by other work on the machine), after one warm-up call that
also compiles the Numba kernels.  torch and tensorcore both use ``--threads`` threads
(``torch.set_num_threads``, ``tc.set_num_threads``, which also sizes NumPy's BLAS).
A start-up line reports ``import tensorcore`` and the first MLP train step in a fresh
process, which loads the kernels from Numba's disk cache (run the script twice to see
the warm-cache figure).  No timing is asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Callable

import numpy as np

import tensorcore as tc
import bench_report  # tests/benchmarks/bench_report.py

Case = dict[str, Callable[[], object]]


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """Best seconds per call over ``repeat`` timed calls, after one untimed call."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def kernel_cases(torch, nb, npb) -> dict[str, tuple[Case, float]]:
    """name -> ({"numba": fn, "numpy": fn, "torch": fn}, bytes moved per call or 0)."""
    F = torch.nn.functional
    rng = np.random.default_rng(0)

    def rand(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    cases: dict[str, tuple[Case, float]] = {}
    x = rand(1024, 1024)
    xt = torch.from_numpy(x)
    cases["softmax 1024x1024"] = ({
        "numba": lambda: nb.softmax(x), "numpy": lambda: npb.softmax(x),
        "torch": lambda: torch.softmax(xt, -1)}, 0)
    w, b = rand(1024), rand(1024)
    wt, bt = torch.from_numpy(w), torch.from_numpy(b)
    cases["layer_norm 1024x1024"] = ({
        "numba": lambda: nb.layer_norm(x, w, b, 1, 1e-5),
        "numpy": lambda: npb.layer_norm(x, w, b, 1, 1e-5),
        "torch": lambda: F.layer_norm(xt, (1024,), wt, bt, 1e-5)}, 0)
    g = rand(8, 64, 32, 32)
    gw, gb = rand(64), rand(64)
    gt, gwt, gbt = torch.from_numpy(g), torch.from_numpy(gw), torch.from_numpy(gb)
    cases["group_norm [8,64,32,32] G=32"] = ({
        "numba": lambda: nb.group_norm(g, gw, gb, 32, 1e-5),
        "numpy": lambda: npb.group_norm(g, gw, gb, 32, 1e-5),
        "torch": lambda: F.group_norm(gt, 32, gwt, gbt, 1e-5)}, 0)

    cx, cw = rand(16, 64, 32, 32), rand(64, 64, 3, 3) * 0.05
    geo = ((1, 1), (1, 1), (1, 1), 1)
    cxt, cwt = torch.from_numpy(cx), torch.from_numpy(cw)
    cases["conv3x3 [16,64,32,32]->64 fwd"] = ({
        "numba": lambda: nb.conv2d(cx, cw, *geo), "numpy": lambda: npb.conv2d(cx, cw, *geo),
        "torch": lambda: F.conv2d(cxt, cwt, padding=1)}, 0)
    cg = rand(16, 64, 32, 32)

    def conv_fwd_bwd(be):
        def run():
            be.conv2d(cx, cw, *geo)
            be.conv2d_grad_input(cg, cw, cx.shape, *geo)
            be.conv2d_grad_weight(cg, cx, cw.shape, *geo)
        return run

    cxr, cwr, cgt = cxt.clone().requires_grad_(), cwt.clone().requires_grad_(), torch.from_numpy(cg)

    def torch_conv_fwd_bwd():
        cxr.grad = cwr.grad = None
        F.conv2d(cxr, cwr, padding=1).backward(cgt)

    cases["conv3x3 [16,64,32,32]->64 fwd+bwd"] = ({
        "numba": conv_fwd_bwd(nb), "numpy": conv_fwd_bwd(npb), "torch": torch_conv_fwd_bwd}, 0)

    n_params, n_tensors = 10_000_000, 100
    flat = {k: (rand(n_params) if k in ("p", "g") else np.zeros(n_params, np.float32))
            for k in ("p", "g", "m", "v")}
    lr, step = np.array([1e-3], np.float32), np.array([1], np.float32)

    def adam(be):
        return lambda: be.adam_update_(flat["p"], flat["g"], flat["m"], flat["v"], None, lr, step,
                                       0.9, 0.999, 1e-8, 0.0, False)

    params = [torch.zeros(n_params // n_tensors, requires_grad=True) for _ in range(n_tensors)]
    for p in params:
        p.grad = torch.randn(p.shape)
    torch_adam = torch.optim.Adam(params, lr=1e-3, foreach=True)
    # read p, g, m, v and write p, m, v: 7 float32 per parameter
    cases["Adam 10M params / 100 tensors"] = ({
        "numba": adam(nb), "numpy": adam(npb), "torch": torch_adam.step}, 7 * 4 * n_params)

    bx, bb = rand(4096, 4096), rand(4096)
    bxt, bbt = torch.from_numpy(bx), torch.from_numpy(bb)
    cases["bias+GELU 4096x4096"] = ({
        "numba": lambda: nb.bias_act(bx, bb, "gelu", 1), "numpy": lambda: npb.bias_act(bx, bb, "gelu", 1),
        "torch": lambda: F.gelu(bxt + bbt)}, 2 * 4 * bx.size)
    return cases


def train_cases(torch, batch_mlp: int = 256, batch_cnn: int = 128) -> dict[str, Case]:
    """MLP 784-512-512-10 and the 8x8-digits CNN, one Adam train step each."""
    import layers
    import optim
    import tensorcore as tc
    import tensorcore.functional as F

    rng = np.random.default_rng(0)
    data = {
        "mlp": (rng.standard_normal((batch_mlp, 784), dtype=np.float32), rng.integers(0, 10, batch_mlp)),
        "cnn": (rng.standard_normal((batch_cnn, 1, 8, 8), dtype=np.float32), rng.integers(0, 10, batch_cnn)),
    }

    def tc_model(kind):
        if kind == "mlp":
            return layers.Sequential(layers.Linear(784, 512), layers.ReLU(), layers.Linear(512, 512),
                                     layers.ReLU(), layers.Linear(512, 10))
        return layers.Sequential(layers.Conv2d(1, 32, 3, padding=1), layers.ReLU(),
                                 layers.Conv2d(32, 64, 3, padding=1), layers.ReLU(), layers.MaxPool2d(2),
                                 layers.Flatten(), layers.Linear(1024, 10))

    def torch_model(kind):
        nn = torch.nn
        if kind == "mlp":
            return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                 nn.Linear(512, 10))
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1),
                             nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1024, 10))

    def tc_step(kind, backend):
        with tc.use_backend(backend):
            model = tc_model(kind)
            opt = optim.Adam(model.parameters(), lr=1e-3)
            x, y = tc.tensor(data[kind][0]), tc.tensor(data[kind][1])

        def step():
            with tc.use_backend(backend):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
        return step

    def torch_step(kind):
        model = torch_model(kind)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = torch.from_numpy(data[kind][0]), torch.from_numpy(data[kind][1])

        def step():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return step

    names = {"mlp": f"MLP 784-512-512-10 b{batch_mlp} Adam step",
             "cnn": f"CNN 8x8 digits b{batch_cnn} Adam step"}
    return {names[k]: {"numba": tc_step(k, "numba"), "numpy": tc_step(k, "numpy"), "torch": torch_step(k)}
            for k in ("mlp", "cnn")}


def startup_line() -> str:
    """``import tensorcore`` and the first MLP train step, in a fresh process."""
    code = (
        "import time; t0 = time.perf_counter()\n"
        "import tensorcore as tc, tensorcore.functional as F, layers, optim, numpy as np\n"
        "t1 = time.perf_counter()\n"
        "with tc.use_backend('numba'):\n"
        "    m = layers.Sequential(layers.Linear(784, 512), layers.ReLU(), layers.Linear(512, 512),"
        " layers.ReLU(), layers.Linear(512, 10))\n"
        "    opt = optim.Adam(m.parameters(), lr=1e-3)\n"
        "    x = tc.tensor(np.zeros((256, 784), np.float32)); y = tc.tensor(np.zeros(256, np.int64))\n"
        "    t2 = time.perf_counter(); opt.zero_grad(); F.cross_entropy(m(x), y).backward(); opt.step()\n"
        "    t3 = time.perf_counter()\n"
        "print(f'{t1 - t0:.3f} {t3 - t2:.3f}')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    imp, first = (float(v) for v in out.stdout.split())
    return f"start-up (fresh process): import tensorcore+layers+optim {imp * 1e3:.0f} ms, first MLP Adam step {first * 1e3:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=15)
    args = bench_report.parse(parser)
    os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))
    import numba
    import torch

    from tensorcore.backends import load
    from tensorcore.backends.numba.threads import thread_info

    backends = load("numba"), load("numpy")
    torch.set_num_threads(args.threads)
    tc.set_num_threads(args.threads)
    info = thread_info()
    bench_report.note(f"threads: torch {torch.get_num_threads()}, tensorcore {tc.get_num_threads()} "
          f"(Numba layer {info['numba_layer']}, BLAS jobs on Numba's pool: {info['blas_on_numba_pool']}); "
          f"numpy {np.__version__}, numba {numba.__version__}, torch {torch.__version__}, "
          f"{os.cpu_count()} cores")
    bench_report.note(startup_line())
    cases = kernel_cases(torch, *backends)
    cases.update({k: (v, 0) for k, v in train_cases(torch).items()})
    table = bench_report.Table(f"Best of {args.repeat} runs, {args.threads} threads",
                               ["case", "numba ms", "numpy ms", "torch ms", "numba/torch", "numpy/numba",
                                "GB/s numba, numpy, torch"], first=36)
    for name, (fns, nbytes) in cases.items():
        t = {k: best_time(fn, args.repeat) for k, fn in fns.items()}
        rates = ", ".join(f"{nbytes / t[k] / 1e9:.1f}" for k in ("numba", "numpy", "torch")) if nbytes else ""
        table.row(name, f"{t['numba'] * 1e3:.3f}", f"{t['numpy'] * 1e3:.3f}", f"{t['torch'] * 1e3:.3f}",
                  f"{t['numba'] / t['torch']:.2f}x", f"{t['numpy'] / t['numba']:.2f}x", rates)


if __name__ == "__main__":
    main()
