"""The training loop ``train_ddpm`` and ``train_vae`` share.

One step: next batch -> ``loss_fn(batch, generator)`` -> backward -> clip the gradient
norm -> AdamW step -> EMA update -> LR schedule step.  Every random draw of a step
(noise, timesteps, label dropout, posterior samples) comes from one device generator
and the batch order from one host generator; both are saved in each checkpoint with
the weights, the EMA, the optimizer and the schedule, so a resumed run continues bit
for bit as if it had never stopped (on the NumPy backend, whose kernels are
deterministic).

The loss is summed on the device and read back every ``log_every`` steps only (one
host round trip per row of the metrics CSV and per progress-bar update).

With ``compile`` on (the default on a GPU), everything of a step but the batch
gather and the LR schedule -- zero_grad, loss, backward, clipping, the AdamW update
and the EMA update -- runs as one ``tc.compile``d call taking the batch tensors: one
replayed plan (one CUDA graph launch on the GPU) per step.  The schedule stays on the
host between calls and writes the optimizer's device learning rate, which the
replayed update reads; the EMA's per-step weight is a device scalar too.  A model the
tracer cannot follow trains eagerly (``fallback="eager"``, one warning).

Under ``tensorcore.distributed.init()`` the loop trains data-parallel: the model is
wrapped in ``DistributedDataParallel`` (backward averages the gradients over the
ranks), each rank takes its share of every batch (``batch_size`` is the global batch)
and draws noise from its own generator (seed + rank; a resumed run reseeds ranks > 0
by step), logged losses are averaged over the ranks, and rank 0 alone writes
checkpoints, metrics and progress.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tqdm.auto import tqdm

import tensorcore as tc
from layers import Module
from optim import AdamW, CosineAnnealingLR, LinearWarmup, LRScheduler, SequentialLR, clip_grad_norm_
from tensorcore import Tensor, distributed
from tensorcore.backends import cpu_backend_name
from tensorcore.compile import CacheInfo, Compiled

from .batches import Batches
from .checkpoint import (Checkpoint, checkpoint_path, latest_checkpoint, load_checkpoint, prune_checkpoints,
                         remove_unfinished, save_checkpoint)
from .ema import EMAModel
from .metrics import MetricsLog, read_metrics
from .options import TrainOptions
from .plot import save_loss_curve

LossFn = Callable[[tuple[Tensor, ...], tc.Generator], Tensor]


@dataclass
class TrainResult:
    """What a finished (or stopped) run leaves: its last step, the logged mean losses,
    the EMA of the weights (``result.ema.copy_to(model.parameters())`` to sample with it)
    and the files written (None without ``out_dir``); ``compile_info``: the compiled step's
    counters (``tc.compile``'s ``cache_info()``: replays, traces, eager fallbacks), None
    when the step ran eagerly."""

    step: int
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    ema: EMAModel | None = None
    checkpoint: str | None = None
    metrics: str | None = None
    loss_curve: str | None = None
    seconds: float = 0.0
    compile_info: CacheInfo | None = None


def warmup_cosine(optimizer: AdamW, warmup_steps: int, total_steps: int, min_lr: float) -> LRScheduler:
    """Linear warmup over ``warmup_steps`` (from lr / warmup_steps), then a cosine decay to
    ``min_lr`` at ``total_steps``."""
    decay_steps = max(1, total_steps - warmup_steps)
    cosine = CosineAnnealingLR(optimizer, T_max=decay_steps, eta_min=min_lr)
    if warmup_steps == 0:
        return cosine
    warmup = LinearWarmup(optimizer, warmup_steps, start_factor=1.0 / warmup_steps)
    return SequentialLR(optimizer, [warmup, cosine], milestones=[warmup_steps])


def compile_enabled(choice: bool | str, device: str) -> bool:
    """``TrainOptions.compile`` resolved for a model on ``device``: "auto" is on, except
    on the CPU with the NumPy reference backend (there the plain eager path is the point)."""
    if choice != "auto":
        return bool(choice)
    return device != "cpu" or cpu_backend_name() != "numpy"


class Trainer:
    """Runs ``loss_fn`` over ``data`` with the shared machinery; ``config`` describes the
    model (stored in every checkpoint so a sampler can rebuild it)."""

    def __init__(self, model: Module, loss_fn: LossFn, data: tuple[Tensor, ...], options: TrainOptions,
                 config: dict[str, Any]) -> None:
        self.model, self.loss_fn, self.options, self.config = model, loss_fn, options, config
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError(f"training: {type(model).__name__} has no trainable parameters")
        device = self.params[0].device
        self.ddp = distributed.DistributedDataParallel(model) if distributed.is_initialized() else None
        self.rank, self.world_size = (distributed.get_rank(), distributed.get_world_size()) if self.ddp else (0, 1)
        self.optimizer = AdamW(self.params, lr=options.lr, betas=options.betas, weight_decay=options.weight_decay)
        self.lr_scheduler = warmup_cosine(self.optimizer, options.warmup_steps, options.steps, options.min_lr)
        self.ema = EMAModel(self.params, decay=options.ema_decay)
        self.generator = tc.Generator(device, options.seed + self.rank)
        self.batches = Batches(data, options.batch_size, options.seed, self.rank, self.world_size)
        self.compiled = compile_enabled(options.compile, device)
        self._compiled_step: Compiled | None = None  # built on the first step, after a resume
        self.step = 0
        self.seconds_before = 0.0  # training time of the parts before a resume
        self._started = time.perf_counter()
        self.checkpoint_dir = os.path.join(options.out_dir, "checkpoints") if options.out_dir else None
        self.last_checkpoint: str | None = None
        self.saved_step = -1
        resume = self._resume_path()
        if self.rank:  # rank 0 writes for everyone
            self.options = dataclasses.replace(options, out_dir=None, progress=False, resume=None)
            self.checkpoint_dir = None
        if resume is not None:
            self.restore(resume)

    @property
    def compile_info(self) -> CacheInfo | None:
        """The compiled step's counters, None while the step runs eagerly or before it."""
        return None if self._compiled_step is None else self._compiled_step.cache_info()

    # ----- checkpoints --------------------------------------------------------------
    def _resume_path(self) -> str | None:
        resume = self.options.resume
        if resume is None or resume is False:
            return None
        target = self.checkpoint_dir if resume is True else resume
        if os.path.isdir(target):
            inner = os.path.join(target, "checkpoints")
            found = latest_checkpoint(target) or (latest_checkpoint(inner) if os.path.isdir(inner) else None)
            if found is None and resume is not True:
                raise ValueError(f"training: resume={resume!r} holds no checkpoint")
            return found
        if not os.path.exists(target):
            raise ValueError(f"training: resume={resume!r} does not exist")
        return target

    def snapshot(self) -> Checkpoint:
        """The run's complete state now, as host arrays."""
        ema_state = self.ema.state_dict()
        shadows = ema_state.pop("shadow_params")
        return Checkpoint(step=self.step, model={k: v.numpy() for k, v in self.model.state_dict().items()},
                          ema=shadows, ema_options=ema_state, optimizer=self.optimizer.state_dict(),
                          lr_scheduler=self.lr_scheduler.state_dict(), rng_noise=self.generator.get_state(),
                          data=self.batches.state(), config=self.config, seconds=self.elapsed())

    def save(self) -> str:
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        path = checkpoint_path(self.checkpoint_dir, self.step)
        save_checkpoint(path, self.snapshot())
        prune_checkpoints(self.checkpoint_dir, self.options.keep_checkpoints)
        self.last_checkpoint, self.saved_step = path, self.step
        return path

    def restore(self, path: str) -> None:
        """Continue from the checkpoint at ``path`` (everything checked before anything changes
        that a failed check could leave half-restored)."""
        checkpoint = load_checkpoint(path)
        if checkpoint.config.get("kind") != self.config.get("kind"):
            raise ValueError(f"training: {path!r} is a {checkpoint.config.get('kind')!r} checkpoint, "
                             f"this run trains {self.config.get('kind')!r}")
        self.model.load_state_dict(checkpoint.model)
        self.ema.load_state_dict({**checkpoint.ema_options, "shadow_params": checkpoint.ema})
        self.optimizer.load_state_dict(checkpoint.optimizer)
        self.lr_scheduler.load_state_dict(checkpoint.lr_scheduler)
        self.generator.set_state(checkpoint.rng_noise)
        if self.rank:  # the checkpoint holds rank 0's generator
            self.generator.manual_seed(self.options.seed + self.rank + self.world_size * checkpoint.step)
        self.batches.load_state(checkpoint.data)
        self.step, self.seconds_before = checkpoint.step, checkpoint.seconds
        self.last_checkpoint, self.saved_step = path, checkpoint.step

    def elapsed(self) -> float:
        """Training wall time so far, over every part of a resumed run."""
        return self.seconds_before + time.perf_counter() - self._started

    # ----- the loop -----------------------------------------------------------------
    def train_step(self) -> tuple[Tensor, Tensor | None]:
        """One optimisation step; returns the loss and the gradient norm (device scalars)."""
        batch = self.batches.next()
        if self.compiled:
            if self._compiled_step is None:
                self._compiled_step = tc.compile(self._update, cache_dir=False, fallback="eager")
            loss, norm = self._compiled_step(self.model, *batch)
        else:
            loss, norm = self._update(self.model, *batch)
        self.lr_scheduler.step()
        return loss, norm

    def _update(self, model: Module, *batch: Tensor) -> tuple[Tensor, Tensor | None]:
        """Everything of a step on the device: zero_grad, loss, backward, clipping, the
        optimizer and EMA updates.  ``model`` is passed so that a compiled call keys on
        its structure and training flags and guards its parameters."""
        self.optimizer.zero_grad(set_to_none=False)
        with tc.set_grad_enabled(True):
            loss = self.loss_fn(batch, self.generator)
        loss.backward()
        norm = clip_grad_norm_(self.params, self.options.grad_clip) if self.options.grad_clip else None
        self.optimizer.step()
        self.ema.step(self.params)
        return loss.detach(), norm

    def run(self) -> TrainResult:
        """Train from the current step to ``options.steps``, logging, checkpointing and
        stopping early when the callback returns False."""
        options, out = self.options, self.options.out_dir
        if out:
            os.makedirs(out, exist_ok=True)
        if self.checkpoint_dir:
            remove_unfinished(self.checkpoint_dir)
        metrics = MetricsLog(os.path.join(out, "metrics.csv"), resume_step=self.step) if out else None
        result = TrainResult(step=self.step, ema=self.ema, metrics=metrics.path if metrics else None)
        self.model.train()
        self._started, window, count = time.perf_counter(), None, 0
        bar = tqdm(total=options.steps, initial=self.step, disable=not options.progress, desc="train",
                   dynamic_ncols=True)
        first_step = self.step + 1
        try:
            while self.step < options.steps:
                lr = self.optimizer.param_groups[0]["lr"]
                loss, norm = self.train_step()
                self.step += 1
                if self.step == first_step:  # its one-time work (compiling kernels, a trace) would skew the ETA
                    bar.unpause()
                window, count = (loss if window is None else window + loss), count + 1
                if self.step % options.log_every == 0 or self.step == options.steps:
                    mean = self._log(result, metrics, window, count, norm, lr, self.elapsed())
                    bar.set_postfix(loss=f"{mean:.4f}", lr=f"{lr:.2e}")
                    window, count = None, 0
                bar.update(1)
                if self.checkpoint_dir and options.checkpoint_every and self.step % options.checkpoint_every == 0:
                    self.save()
                if options.callback is not None and options.callback(self.step) is False:
                    break
        finally:
            bar.close()
        if self.checkpoint_dir and self.saved_step != self.step:
            self.save()
        result.step, result.checkpoint = self.step, self.last_checkpoint
        result.seconds = self.elapsed()
        result.compile_info = self.compile_info
        if out and result.steps:
            logged = read_metrics(metrics.path)
            result.loss_curve = save_loss_curve(logged["step"], logged["loss"], os.path.join(out, "loss.png"))
        return result

    def _log(self, result: TrainResult, metrics: MetricsLog | None, window: Tensor, count: int,
             norm: Tensor | None, lr: float, seconds: float) -> float:
        if self.ddp is not None:
            distributed.all_reduce(window, op="avg")
        mean = float(window.item()) / count
        if mean != mean or mean in (float("inf"), float("-inf")):
            raise FloatingPointError(f"training diverged: the mean loss of steps {self.step - count + 1}.."
                                     f"{self.step} is {mean}; lower lr or set grad_clip")
        result.steps.append(self.step)
        result.losses.append(mean)
        if metrics is not None:
            metrics.append({"step": self.step, "loss": mean, "lr": lr,
                            "grad_norm": float(norm.item()) if norm is not None else float("nan"),
                            "seconds": seconds})
        return mean
