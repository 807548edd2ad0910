"""Where the time of one CPU training step goes, by op kind: tensorcore (the default Numba
backend) against PyTorch + diffusers' ``UNet2DModel`` on the same step.

    python tests/benchmarks/cpu_train_profile.py [--threads 2] [--warmup 3] [--steps 10] [--rounds 3]

The step is the one ``python -m diffusion train`` runs: the digits UNet
(``diffusion/cli/digits.py``: ``unet_config(8, (32, 64), 1, 1)``), a batch of 64 8x8
images, DDPM noise at uniform timesteps with epsilon prediction, label dropout 0.1, an
MSE loss, backward, gradient clipping at 1.0, AdamW (lr 2e-3, no weight decay) with its
warmup + cosine schedule, then the EMA update (decay 0.999).  PyTorch runs the same
step with diffusers' ``UNet2DModel`` (same config), ``DDPMScheduler.add_noise``,
``torch.optim.AdamW``, ``clip_grad_norm_``, diffusers' ``EMAModel`` and its cosine
schedule, each as a user gets them by default.

Each side runs in a process of its own (``--side ours`` / ``--side torch``), both at
``--threads`` threads (``tc.set_num_threads``, ``torch.set_num_threads``): ``--warmup``
steps (on a cold Numba cache the first compiles the kernels), ``--steps`` steps timed
whole, then ``--steps`` steps profiled.  Ours keeps two trainers: the step as the CLI
runs it (``compile="auto"``: a compiled plan on the Numba backend), which the last row
times, and an eager one, timed in turn with it and profiled (a compiled replay calls
the kernels it bound, past the timers).  ``--rounds`` rounds run the two sides in turn
(PyTorch first in every other round), so a change in the machine's load reaches both.
Every figure is in ms per step: the median over rounds of each round's median over steps.

* ours: this script wraps every protocol method of the backend object with a timer; a
  backend call made inside another one counts in the outer call, whose method names the
  kind (``conv2d_grad_input`` is a convolution's dgrad, ``group_norm_backward`` a norm...).
* PyTorch: ``torch.profiler``; every outermost op (an ATen op, or in the backward an
  autograd node) counts with its children, its name naming the kind; the input gradient
  and the weight gradient of a convolution are one op there (``ConvolutionBackward0``).
* On both sides the batch draw, the optimizer (zero_grad, clipping, the update, the LR
  schedule) and the EMA update are marked, and every op they run counts in their row.
* "Python / other" is the profiled step minus the ops: autograd bookkeeping, module
  calls, the interpreter.  The timers and the profiler cost time themselves (a few
  microseconds a call), which the last row, the step timed without them, leaves out.

No timing is asserted.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any, Callable

import numpy as np

import bench_report  # tests/benchmarks/bench_report.py

IMAGE_SIZE, CHANNELS, LAYERS_PER_BLOCK = 8, (32, 64), 1  # the CLI's defaults (diffusion/cli/digits.py)
LR, WARMUP_STEPS, TOTAL_STEPS, GRAD_CLIP, EMA_DECAY, LABEL_DROPOUT = 2e-3, 100, 1500, 1.0, 0.999, 0.1

# The rows of the table, in order; "conv backward" is the sum of dgrad and wgrad.
CONV_FWD, CONV_DGRAD, CONV_WGRAD, CONV_BWD = "conv forward", "conv dgrad", "conv wgrad", "conv backward"
GEMM, NORMS, ATTENTION, RESAMPLING = "GEMM (linear layers)", "norms", "attention", "up/down-sampling"
ELEMENTWISE, EMBEDDING, COPIES = "elementwise, reductions", "embedding, indexing", "copies, layout, allocation"
DATA, OPTIMIZER, EMA, OTHER = "batch draw, RNG", "optimizer (AdamW, clipping)", "EMA", "Python / other"
ROWS = [CONV_FWD, CONV_BWD, CONV_DGRAD, CONV_WGRAD, GEMM, NORMS, ATTENTION, RESAMPLING, ELEMENTWISE, EMBEDDING,
        COPIES, DATA, OPTIMIZER, EMA, OTHER]
PHASE_KINDS = {"data": DATA, "optimizer": OPTIMIZER, "ema": EMA}  # phases whose ops all count in one row

# Our backend protocol methods by kind; every other method is elementwise or a reduction.
OUR_KINDS = {
    CONV_FWD: ("conv2d", "group_norm_conv2d"),
    CONV_DGRAD: ("conv2d_grad_input",),
    CONV_WGRAD: ("conv2d_grad_weight",),
    GEMM: ("matmul", "matmul_bias_act", "matmul_bias_act_group", "lora_linear"),
    NORMS: ("group_norm", "group_norm_backward", "layer_norm", "layer_norm_backward", "batch_norm",
            "batch_norm_backward"),
    ATTENTION: ("attention", "attention_backward", "attention_output", "softmax", "softmax_backward",
                "log_softmax", "log_softmax_backward"),
    RESAMPLING: ("upsample_nearest2d", "upsample_nearest2d_backward", "upsample_bilinear2d",
                 "upsample_bilinear2d_backward", "max_pool2d", "max_pool2d_backward", "avg_pool2d",
                 "avg_pool2d_backward"),
    EMBEDDING: ("embedding_backward", "getitem", "index_add_", "setitem_"),
    COPIES: ("copy", "copy_", "astype", "concatenate", "stack", "pad", "transpose", "reshape", "broadcast_to",
             "flip", "empty", "zeros", "full", "array", "arange", "eye", "linspace", "from_numpy", "to_numpy"),
    DATA: ("rng", "normal", "uniform", "integers"),
}
OUR_KIND = {method: kind for kind, methods in OUR_KINDS.items() for method in methods}

# PyTorch's outermost ops by kind: the ATen name or, in the backward, the autograd node's
# name without "Backward<n>", lower case and without leading underscores.  Exact names of
# copies, then prefixes; everything else is elementwise or a reduction.
TORCH_PREFIXES = {
    CONV_FWD: ("conv", "mkldnn_conv", "slow_conv", "thnn_conv"),
    GEMM: ("linear", "addmm", "mm", "matmul", "bmm"),
    NORMS: ("group_norm", "native_group_norm", "nativegroupnorm", "layer_norm", "native_layer_norm",
            "nativelayernorm", "batch_norm", "native_batch_norm", "nativebatchnorm"),
    ATTENTION: ("scaled_dot_product", "scaleddotproduct", "softmax", "baddbmm"),
    RESAMPLING: ("upsample", "interpolate", "max_pool", "maxpool", "avg_pool", "avgpool"),
    EMBEDDING: ("embedding", "index", "gather", "scatter"),
    DATA: ("rand", "normal", "uniform"),
}
TORCH_COPIES = {"cat", "stack", "copy", "copy_", "clone", "contiguous", "to", "to_copy", "tocopy", "empty",
                "empty_like", "zeros", "zeros_like", "zero_", "full", "full_like", "fill_", "view", "unsafeview",
                "reshape", "reshapealias", "permute", "transpose", "t", "expand", "split", "chunk", "slice",
                "select", "unsqueeze", "squeeze", "flatten", "unbind", "as_strided", "alias", "detach"}


def torch_kind(name: str) -> str:
    """The kind of one of PyTorch's outermost ops, ``aten::conv2d`` or
    ``autograd::engine::evaluate_function: ConvolutionBackward0``."""
    op = name.rpartition(": ")[2].removeprefix("aten::").lower()
    backward = "backward" in op
    op = op.partition("backward")[0].lstrip("_")
    if op in TORCH_COPIES:
        return COPIES
    kind = next((kind for kind, prefixes in TORCH_PREFIXES.items() if op.startswith(prefixes)), ELEMENTWISE)
    return CONV_BWD if kind == CONV_FWD and backward else kind


class Phases:
    """Which marked part of the step runs now (``None`` outside them: forward and backward)."""

    def __init__(self) -> None:
        self.current: str | None = None

    def wrap(self, name: str, fn: Callable) -> Callable:
        """``fn`` marking the phase ``name`` while it runs."""
        @functools.wraps(fn)
        def marked(*args: Any, **kwargs: Any) -> Any:
            saved, self.current = self.current, name
            try:
                return fn(*args, **kwargs)
            finally:
                self.current = saved
        return marked


# ----- our side ----------------------------------------------------------------------------
class BackendTimer:
    """Times the backend calls of a step by kind (see the module doc)."""

    def __init__(self, backend: Any, phases: Phases) -> None:
        from tensorcore.backends.dispatch import protocol_methods

        self.phases, self.depth, self.seconds = phases, 0, defaultdict(float)
        for name in protocol_methods():
            setattr(backend, name, self._timed(name, getattr(backend, name)))

    def _timed(self, name: str, method: Callable) -> Callable:
        kind = OUR_KIND.get(name, ELEMENTWISE)

        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:  # inside another backend call: counted there
                return method(*args, **kwargs)
            self.depth += 1
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[PHASE_KINDS.get(self.phases.current, kind)] += time.perf_counter() - start
                self.depth -= 1
        return timed

    def take(self) -> dict[str, float]:
        taken, self.seconds = dict(self.seconds), defaultdict(float)
        return taken


def our_step(batch_size: int, compile: bool | str = False) -> tuple[Callable[[], Any],
                                                                    Callable[[], Callable[[], dict[str, float]]]]:
    """(step, profiling): ``step()`` runs one training step (a compiled one as the CLI
    runs it by default for ``compile="auto"``); ``profiling()`` installs the timers and
    returns ``profiled_step()`` -> seconds by kind, ``OTHER`` included (an eager step only:
    a compiled replay calls the kernels it bound, past the timers)."""
    import tensorcore as tc
    from diffusion import DDPMScheduler, UNet2D
    from diffusion.cli.digits import NULL_CLASS_LABEL, unet_config
    from diffusion.datasets import digit_images
    from diffusion.training import loop
    from diffusion.training.ddpm import ddpm_trainer

    images, labels = digit_images(IMAGE_SIZE)
    unet = UNet2D(**unet_config(IMAGE_SIZE, CHANNELS, LAYERS_PER_BLOCK, images.shape[1]))
    trainer = ddpm_trainer(unet, DDPMScheduler(clip_sample=True), (images, labels), label_dropout=LABEL_DROPOUT,
                           null_class_label=NULL_CLASS_LABEL, steps=TOTAL_STEPS, batch_size=batch_size, lr=LR,
                           warmup_steps=WARMUP_STEPS, grad_clip=GRAD_CLIP, ema_decay=EMA_DECAY, progress=False,
                           compile=compile)
    trainer.model.train()

    def step() -> Any:
        loss, _ = trainer.train_step()
        return loss.item()  # the host waits for the step, as the training loop's logging does

    def profiling() -> Callable[[], dict[str, float]]:
        phases = Phases()
        timer = BackendTimer(tc.get_backend(), phases)
        trainer.batches.next = phases.wrap("data", trainer.batches.next)
        for owner, name in ((trainer.optimizer, "zero_grad"), (trainer.optimizer, "step"),
                            (trainer.lr_scheduler, "step"), (loop, "clip_grad_norm_")):
            setattr(owner, name, phases.wrap("optimizer", getattr(owner, name)))
        trainer.ema.step = phases.wrap("ema", trainer.ema.step)

        def profiled_step() -> dict[str, float]:
            start = time.perf_counter()
            step()
            seconds = timer.take()
            seconds[OTHER] = time.perf_counter() - start - sum(seconds.values())
            return seconds
        return profiled_step
    return step, profiling


# ----- PyTorch's side ----------------------------------------------------------------------
def torch_step(batch_size: int) -> tuple[Callable[[], Any], Callable[[], Callable[[], dict[str, float]]]]:
    """(step, profiling) as ``our_step`` returns them, for PyTorch and diffusers."""
    import torch
    import torch.nn.functional as F
    from diffusers import DDPMScheduler, UNet2DModel
    from diffusers.optimization import get_cosine_schedule_with_warmup
    from diffusers.training_utils import EMAModel
    from diffusion.cli.digits import NULL_CLASS_LABEL, unet_config
    from diffusion.datasets import digit_images

    images, labels = (torch.from_numpy(np.ascontiguousarray(a)) for a in digit_images(IMAGE_SIZE))
    labels = labels.long()
    torch.manual_seed(0)
    unet = UNet2DModel(**unet_config(IMAGE_SIZE, CHANNELS, LAYERS_PER_BLOCK, images.shape[1])).train()
    scheduler = DDPMScheduler(clip_sample=True)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=LR, weight_decay=0.0)
    lr_schedule = get_cosine_schedule_with_warmup(optimizer, WARMUP_STEPS, TOTAL_STEPS)
    ema = EMAModel(unet.parameters(), decay=EMA_DECAY)
    timesteps = scheduler.config.num_train_timesteps
    record = torch.profiler.record_function

    def step() -> Any:
        with record("phase:data"):
            index = torch.randint(0, len(images), (batch_size,))
            x0, y = images[index], labels[index]
        with record("phase:optimizer"):
            optimizer.zero_grad(set_to_none=False)
        noise = torch.randn_like(x0)
        t = torch.randint(0, timesteps, (batch_size,))
        y = torch.where(torch.rand(batch_size) < LABEL_DROPOUT, torch.full_like(y, NULL_CLASS_LABEL), y)
        loss = F.mse_loss(unet(scheduler.add_noise(x0, noise, t), t, class_labels=y).sample, noise)
        loss.backward()
        with record("phase:optimizer"):
            torch.nn.utils.clip_grad_norm_(unet.parameters(), GRAD_CLIP)
            optimizer.step()
            lr_schedule.step()
        with record("phase:ema"):
            ema.step(unet.parameters())
        return loss.item()

    def profiling() -> Callable[[], dict[str, float]]:
        def profiled_step() -> dict[str, float]:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                step()
                wall = time.perf_counter() - start
            seconds: dict[str, float] = defaultdict(float)
            for event in prof.events():
                if event.cpu_parent is not None:
                    continue
                if event.name.startswith("phase:"):
                    seconds[PHASE_KINDS[event.name.removeprefix("phase:")]] += event.cpu_time_total / 1e6
                else:
                    seconds[torch_kind(event.name)] += event.cpu_time_total / 1e6
            seconds[OTHER] = wall - sum(seconds.values())
            return dict(seconds)
        return profiled_step
    return step, profiling


# ----- one side in its own process ---------------------------------------------------------
def run_side(side: str, threads: int, warmup: int, steps: int, batch_size: int) -> dict[str, Any]:
    """Median ms per step by kind (``"kinds"``), of the whole step (``"step_ms"``: ours as
    the CLI runs it, compiled) and, for ours, of the eager step that is profiled."""
    eager_step = None
    if side == "ours":
        import tensorcore as tc

        tc.set_num_threads(threads)
        step, _ = our_step(batch_size, "auto")
        eager_step, profiling = our_step(batch_size)
        engine = f"tensorcore, backend {tc.get_backend().name}, {tc.get_num_threads()} threads"
    else:
        import torch

        torch.set_num_threads(threads)
        step, profiling = torch_step(batch_size)
        engine = f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads"
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    for _ in range(warmup - 1):
        step()
    for _ in range(warmup if eager_step else 0):
        eager_step()
    whole, eager = [], []
    for _ in range(steps):  # the default step and the eager one in turn
        for run, times in ((step, whole), (eager_step, eager)):
            if run is not None:
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
    profiled_step = profiling()
    per_step = [profiled_step() for _ in range(steps)]
    profiled = [sum(s.values()) for s in per_step]
    for s in per_step:  # ours times dgrad and wgrad apart, PyTorch's one op does both
        s.setdefault(CONV_BWD, s.get(CONV_DGRAD, 0.0) + s.get(CONV_WGRAD, 0.0))
    return {"engine": engine, "first_step_s": first, "step_ms": 1e3 * statistics.median(whole),
            "eager_ms": 1e3 * statistics.median(eager) if eager else None,
            "profiled_ms": 1e3 * statistics.median(profiled),
            "kinds": {kind: 1e3 * statistics.median(s.get(kind, 0.0) for s in per_step) for kind in ROWS}}


def measure(side: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--side", side, "--threads", str(args.threads), "--warmup",
               str(args.warmup), "--steps", str(args.steps), "--batch-size", str(args.batch_size)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"the {side} side failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_round(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over rounds of every figure of one side's results."""
    eager = [r["eager_ms"] for r in results if r.get("eager_ms") is not None]
    return {"engine": results[0]["engine"],
            "step_ms": statistics.median(r["step_ms"] for r in results),
            "eager_ms": statistics.median(eager) if eager else None,
            "profiled_ms": statistics.median(r["profiled_ms"] for r in results),
            "kinds": {kind: statistics.median(r["kinds"][kind] for r in results) for kind in ROWS}}


def cell(ms: float | None) -> str:
    return "—" if ms is None else f"{ms:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="threads on both sides (default 2)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--steps", type=int, default=10, help="steps timed, then as many profiled (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both sides (default 3)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--side", choices=("ours", "torch"), help=argparse.SUPPRESS)  # one side, as JSON
    args = parser.parse_args() if "--side" in sys.argv else bench_report.parse(parser)
    if min(args.warmup, args.steps, args.rounds) < 1:
        parser.error("--warmup, --steps and --rounds must be >= 1")
    if args.side:
        print(json.dumps(run_side(args.side, args.threads, args.warmup, args.steps, args.batch_size)))
        return
    load_before = os.getloadavg()[0]
    rounds: dict[str, list[dict[str, Any]]] = {"ours": [], "torch": []}
    for r in range(args.rounds):
        for side in ("ours", "torch") if r % 2 == 0 else ("torch", "ours"):
            rounds[side].append(measure(side, args))
    ours, theirs = (median_round(rounds[side]) for side in ("ours", "torch"))
    first_ours, first_torch = (rounds[side][0]["first_step_s"] for side in ("ours", "torch"))
    bench_report.note(f"ours: {ours['engine']}; PyTorch: {theirs['engine']}, diffusers UNet2DModel; "
                      f"batch {args.batch_size} at {IMAGE_SIZE}x{IMAGE_SIZE}; {args.rounds} rounds of {args.steps} "
                      f"steps after {args.warmup} warm-up steps (the first step of the first round: ours "
                      f"{first_ours:.1f} s, PyTorch {first_torch:.1f} s); load average {load_before:.2f} before, "
                      f"{os.getloadavg()[0]:.2f} after")
    table = bench_report.Table("ms per training step, by op kind", ["op kind", "ours", "PyTorch", "ours / PyTorch"],
                               first=28)
    for kind in ROWS:
        mine = ours["kinds"][kind]
        other = None if kind in (CONV_DGRAD, CONV_WGRAD) else theirs["kinds"][kind]
        label = f"  {kind} (ours only)" if other is None else kind
        ratio = f"{mine / other:.2f}" if other else "—"
        table.row(label, cell(mine), cell(other), ratio)
    table.row("profiled step", cell(ours["profiled_ms"]), cell(theirs["profiled_ms"]),
              f"{ours['profiled_ms'] / theirs['profiled_ms']:.2f}")
    table.row("eager step, not profiled", cell(ours["eager_ms"]), cell(theirs["step_ms"]),
              f"{ours['eager_ms'] / theirs['step_ms']:.2f}")
    table.row("step as the CLI runs it", cell(ours["step_ms"]), cell(theirs["step_ms"]),
              f"{ours['step_ms'] / theirs['step_ms']:.2f}")


if __name__ == "__main__":
    main()
