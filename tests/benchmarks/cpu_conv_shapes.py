"""Every convolution of one CPU training step of the digits UNet, pass by pass: the Numba
backend against PyTorch (oneDNN) on the same shapes.

    python tests/benchmarks/cpu_conv_shapes.py [--threads 2] [--repeat 30] [--rounds 3]

The step is the one ``python -m diffusion train`` runs (``cpu_train_profile.py`` profiles
it whole).  A first process runs two steps of it on the Numba backend and records the
arguments of every ``conv2d`` / ``conv2d_grad_input`` / ``conv2d_grad_weight`` call of
the second; then every distinct call is timed on both sides, each side in a process of
its own at ``--threads`` threads (``tc.set_num_threads``, ``torch.set_num_threads``),
``--rounds`` rounds in turn (PyTorch first in every other round):

* ours: the backend method itself (the forward with its bias, as the step calls it);
* PyTorch: ``F.conv2d`` with the bias for the forward, and the op autograd runs for a
  convolution's backward, ``aten::convolution_backward``, asked for the input gradient
  alone (dgrad) or the weight gradient alone (wgrad).  Autograd asks for both and the
  bias gradient in one call: its time is the last table's "PyTorch backward".

Each figure is the median over rounds of a round's median over ``--repeat`` calls (after
two untimed ones), in ms per call; "cpu" is process CPU time per call (2x the wall time
when both threads work throughout).  The totals weight every shape by its calls per step.
No timing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from typing import Any, Callable

import numpy as np

import bench_report  # tests/benchmarks/bench_report.py

PASSES = ("conv2d", "conv2d_grad_input", "conv2d_grad_weight")
LABELS = {"conv2d": "fwd", "conv2d_grad_input": "dgrad", "conv2d_grad_weight": "wgrad"}
TORCH_BACKWARD = "torch backward"  # PyTorch's input, weight and bias gradients in one call


def step_convolutions() -> list[dict[str, Any]]:
    """The convolution calls of one training step: {pass, x, w, stride, padding, dilation,
    groups, calls}, x and w being the input's and the weight's shapes."""
    sys.path.insert(0, os.path.dirname(__file__))
    import tensorcore as tc
    from cpu_train_profile import our_step

    step, _ = our_step(64)
    step()  # the first step compiles; the second is recorded
    backend, calls = tc.get_backend(), Counter()

    def recording(name: str, method: Callable) -> Callable:
        def record(*args: Any, **kwargs: Any) -> Any:
            if name == "conv2d":
                x, w, geometry = args[0].shape, args[1].shape, args[2:6]
            elif name == "conv2d_grad_input":
                x, w, geometry = args[2], args[1].shape, args[3:7]
            else:
                x, w, geometry = args[1].shape, args[2], args[3:7]
            stride, padding, dilation, groups = geometry
            calls[(name, tuple(x), tuple(w), tuple(stride), tuple(padding), tuple(dilation), groups)] += 1
            return method(*args, **kwargs)
        return record

    for name in PASSES:
        setattr(backend, name, recording(name, getattr(backend, name)))
    step()
    keys = ("pass", "x", "w", "stride", "padding", "dilation", "groups")
    convs = [dict(zip(keys, key), calls=n) for key, n in sorted(calls.items(), key=lambda kv: kv[0][1:] + kv[0][:1])]
    with_dgrad = {key[1:] for key in calls if key[0] == "conv2d_grad_input"}
    for conv, key in zip(convs, sorted(calls, key=lambda k: k[1:] + k[:1])):
        conv["needs_dgrad"] = key[1:] in with_dgrad  # else the input needs no gradient (the first layer)
    return convs


def out_shape(conv: dict[str, Any]) -> tuple[int, int, int, int]:
    """The convolution's output shape [N, Cout, Ho, Wo]."""
    (n, _, h, w), (cout, _, kh, kw) = conv["x"], conv["w"]
    (sh, sw), (ph, pw), (dh, dw) = conv["stride"], conv["padding"], conv["dilation"]
    return (n, cout, (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1)


def median_call(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(median wall ms, mean process CPU ms) per call over ``repeat`` calls after two."""
    fn()
    fn()
    walls, cpu0 = [], time.process_time()
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - start)
    return 1e3 * statistics.median(walls), 1e3 * (time.process_time() - cpu0) / repeat


def our_calls(conv: dict[str, Any], x: np.ndarray, w: np.ndarray, b: np.ndarray,
              g: np.ndarray) -> dict[str, Callable[[], object]]:
    import tensorcore as tc

    nb = tc.get_backend()
    geo = (conv["stride"], conv["padding"], conv["dilation"], conv["groups"])
    return {"conv2d": lambda: nb.conv2d(x, w, *geo, bias=b),
            "conv2d_grad_input": lambda: nb.conv2d_grad_input(g, w, x.shape, *geo),
            "conv2d_grad_weight": lambda: nb.conv2d_grad_weight(g, x, w.shape, *geo)}


def torch_calls(conv: dict[str, Any], x: np.ndarray, w: np.ndarray, b: np.ndarray,
                g: np.ndarray) -> dict[str, Callable[[], object]]:
    import torch

    xt, wt, bt, gt = (torch.from_numpy(a) for a in (x, w, b, g))
    geo = (list(conv["stride"]), list(conv["padding"]), list(conv["dilation"]))
    groups = conv["groups"]

    def backward(mask: list[bool]) -> Callable[[], object]:
        return lambda: torch.ops.aten.convolution_backward(gt, xt, wt, [w.shape[0]], *geo, False, [0, 0],
                                                           groups, mask)

    return {"conv2d": lambda: torch.nn.functional.conv2d(xt, wt, bt, *geo, groups),
            "conv2d_grad_input": backward([True, False, False]),
            "conv2d_grad_weight": backward([False, True, False]),
            TORCH_BACKWARD: backward([conv["needs_dgrad"], True, True])}


def run_side(side: str, threads: int, repeat: int, convs: list[dict[str, Any]]) -> dict[str, Any]:
    """{"engine", "figures": [(wall ms, cpu ms) per conv and pass name]}."""
    if side == "ours":
        import tensorcore as tc

        tc.set_num_threads(threads)
        calls, engine = our_calls, f"tensorcore, backend {tc.get_backend().name}, {tc.get_num_threads()} threads"
    else:
        import torch

        torch.set_num_threads(threads)
        calls, engine = torch_calls, f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads"
    rng = np.random.default_rng(0)
    figures = []
    for conv in convs:
        x = rng.standard_normal(conv["x"], dtype=np.float32)
        w = rng.standard_normal(conv["w"], dtype=np.float32) * np.float32(0.05)
        b = rng.standard_normal(conv["w"][0], dtype=np.float32)
        g = rng.standard_normal(out_shape(conv), dtype=np.float32)
        fns = calls(conv, x, w, b, g)
        names = [conv["pass"]] + ([TORCH_BACKWARD] if side == "torch" and conv["pass"] == "conv2d_grad_weight" else [])
        figures.append({name: median_call(fns[name], repeat) for name in names})
    return {"engine": engine, "figures": figures}


def measure(side: str, args: argparse.Namespace, convs: list[dict[str, Any]]) -> dict[str, Any]:
    command = [sys.executable, __file__, "--side", side, "--threads", str(args.threads), "--repeat", str(args.repeat)]
    done = subprocess.run(command, input=json.dumps(convs), capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"the {side} side failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def shape_label(conv: dict[str, Any]) -> str:
    (n, c, h, w), (cout, _, kh, kw) = conv["x"], conv["w"]
    label = f"{c}->{cout} {kh}x{kw} @{h}x{w}"
    if tuple(conv["stride"]) != (1, 1):
        label += f" s{conv['stride'][0]}"
    if conv["groups"] != 1:
        label += f" g{conv['groups']}"
    return label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="threads on both sides (default 2)")
    parser.add_argument("--repeat", type=int, default=30, help="timed calls per figure (default 30)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both sides (default 3)")
    parser.add_argument("--side", choices=("shapes", "ours", "torch"), help=argparse.SUPPRESS)
    args = parser.parse_args() if "--side" in sys.argv else bench_report.parse(parser)
    if min(args.repeat, args.rounds) < 1:
        parser.error("--repeat and --rounds must be >= 1")
    if args.side == "shapes":
        print(json.dumps(step_convolutions()))
        return
    if args.side:
        print(json.dumps(run_side(args.side, args.threads, args.repeat, json.loads(sys.stdin.read()))))
        return
    convs = measure("shapes", args, [])
    rounds: dict[str, list[dict[str, Any]]] = {"ours": [], "torch": []}
    for r in range(args.rounds):
        for side in ("ours", "torch") if r % 2 == 0 else ("torch", "ours"):
            rounds[side].append(measure(side, args, convs))

    def figure(side: str, i: int, name: str) -> tuple[float, float]:
        runs = [run["figures"][i][name] for run in rounds[side]]
        return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)

    bench_report.note(f"ours: {rounds['ours'][0]['engine']}; PyTorch: {rounds['torch'][0]['engine']}; "
                      f"{args.rounds} rounds, median of {args.repeat} calls; load average {os.getloadavg()[0]:.2f}")
    table = bench_report.Table("ms per call, by convolution and pass (x: N=64 images)",
                               ["pass", "shape", "calls", "ours", "ours cpu", "PyTorch", "torch cpu", "ours/PyTorch"],
                               first=5)
    totals: dict[str, list[float]] = {}
    for i, conv in enumerate(convs):
        name = conv["pass"]
        (mine, mine_cpu), (theirs, theirs_cpu) = figure("ours", i, name), figure("torch", i, name)
        table.row(LABELS[name], shape_label(conv), conv["calls"], f"{mine:.3f}", f"{mine_cpu:.3f}", f"{theirs:.3f}",
                  f"{theirs_cpu:.3f}", f"{mine / theirs:.2f}")
        total = totals.setdefault(LABELS[name], [0.0, 0.0])
        total[0] += conv["calls"] * mine
        total[1] += conv["calls"] * theirs
        if name == "conv2d_grad_weight":
            totals.setdefault(TORCH_BACKWARD, [0.0, 0.0])[1] += conv["calls"] * figure("torch", i, TORCH_BACKWARD)[0]
    summary = bench_report.Table("ms per training step (each shape times its calls)",
                                 ["pass", "ours", "PyTorch", "ours/PyTorch"], first=28)
    for key in ("fwd", "dgrad", "wgrad"):
        mine, theirs = totals[key]
        summary.row(key, f"{mine:.2f}", f"{theirs:.2f}", f"{mine / theirs:.2f}")
    backward = totals["dgrad"][0] + totals["wgrad"][0]
    theirs = totals[TORCH_BACKWARD][1]
    summary.row("backward (PyTorch: one call)", f"{backward:.2f}", f"{theirs:.2f}", f"{backward / theirs:.2f}")


if __name__ == "__main__":
    main()
