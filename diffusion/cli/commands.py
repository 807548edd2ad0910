"""What each command does, given its parsed arguments.

A ``train`` run folder holds ``checkpoints/`` (the latest two, for ``--resume``),
``metrics.csv``, ``loss.png``, ``pipeline/`` (the EMA weights as a diffusers-style
pipeline folder) and ``samples.png`` (one row per digit).  ``train-vae`` writes
``vae/`` and ``reconstructions.png`` instead; ``sample`` and ``sample-latent`` write
``samples.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import time
from typing import Any

import numpy as np

import tensorcore as tc
from tensorcore import distributed

from ..datasets import NUM_DIGIT_CLASSES, digit_images
from ..images import labelled_rows, save_image_grid, save_png
from ..models import AutoencoderKL, UNet2D
from ..pipelines import DiffusionPipeline, LatentDiffusionPipeline
from ..pipelines.pretrained import INDEX_NAME, SCHEDULERS, read_index
from ..schedulers import DDIMScheduler, DDPMScheduler
from ..training import latent_scaling_factor, latest_checkpoint, load_checkpoint, train_ddpm, train_vae
from ..training.loop import compile_enabled
from . import parallel, train_kernels
from .args import UsageError
from .digits import NULL_CLASS_LABEL, unet_config, vae_config
from .runs import (RUNS, check_not_another_run, check_outputs, planned_out, recorded_options, restore_options,
                   run_folder)

TRAIN_OUTPUTS = {"files": ("metrics.csv", "loss.png", "samples.png"), "folders": ("checkpoints", "pipeline")}
VAE_OUTPUTS = {"files": ("metrics.csv", "loss.png", "reconstructions.png"), "folders": ("checkpoints", "vae")}
COMPILE_CHOICES = {"auto": "auto", "on": True, "off": False}
SAMPLERS = {"ddim": "DDIMScheduler", "ddpm": "DDPMScheduler", "dpm": "DPMSolverMultistepScheduler",
            "euler": "EulerDiscreteScheduler"}


# ----- folders ----------------------------------------------------------------------------
def newest_run() -> str:
    """The most recent ``runs/train-*`` folder (the default ``--checkpoint``)."""
    runs = [p for p in glob.glob(os.path.join(RUNS, "train-*")) if os.path.isdir(p) and "train-vae" not in p]
    if not runs:
        raise UsageError(f"no --checkpoint given and no {RUNS}/train-* run found; "
                         f"run `python -m diffusion train` first")
    return max(runs, key=os.path.getmtime)


def _elapsed(seconds: float) -> str:
    minutes, seconds = divmod(seconds, 60)
    return f"{int(minutes)} min {seconds:.0f} s" if minutes else f"{seconds:.1f} s"


def _progress(args: argparse.Namespace) -> bool:
    return not args.no_progress


# ----- sampling ---------------------------------------------------------------------------
def sample_grid(pipeline: DiffusionPipeline, args: argparse.Namespace, path: str) -> str:
    """Sample ``args.per_class`` images of each digit in ``args.digits`` (rows) into a PNG."""
    digits = list(args.digits)
    conditional = unwrapped_config(pipeline.unet).get("num_class_embeds") is not None
    labels = np.repeat(digits, args.per_class) if conditional else None
    batch = len(digits) * args.per_class
    result = pipeline.generate(batch_size=batch, num_inference_steps=args.sample_steps, seed=args.seed,
                               eta=args.eta, guidance_scale=args.guidance_scale if conditional else 1.0,
                               class_labels=labels, progress=_progress(args))
    size = result.images.shape[-1]
    scale = max(1, round(48 / size))
    if conditional:
        return save_png(labelled_rows(result.images, [str(d) for d in digits], scale), path)
    return save_image_grid(result.images, path, rows=len(digits), scale=scale)


def unwrapped_config(unet: Any) -> dict[str, Any]:
    return dict(getattr(unet, "__wrapped__", unet).config)


def with_sampler(pipeline: DiffusionPipeline, name: str) -> DiffusionPipeline:
    """``pipeline`` with its scheduler replaced by the sampler ``name`` (same noise schedule).
    Every option is passed on as set, defaults included: ``from_config`` would otherwise give
    options left at their default (such as ``timestep_spacing``) the new class's default,
    and a freshly built scheduler would sample differently from the same one saved and loaded."""
    options = {k: v for k, v in pipeline.scheduler.config.items() if not k.startswith("_")}
    pipeline.scheduler = SCHEDULERS[SAMPLERS[name]].from_config(options)
    return pipeline


def load_pipeline(source: str, latent: bool) -> DiffusionPipeline:
    """A pipeline from a run folder, a pipeline folder or a training checkpoint file."""
    cls = LatentDiffusionPipeline if latent else DiffusionPipeline
    if os.path.isdir(source):
        for folder in (source, os.path.join(source, "pipeline")):
            if os.path.exists(os.path.join(folder, INDEX_NAME)):
                _check_kind(folder, "vae" in read_index(folder), latent)
                return cls.from_pretrained(folder)
        found = latest_checkpoint(os.path.join(source, "checkpoints"))
        if found is None:
            raise UsageError(f"--checkpoint {source!r} holds no pipeline/ and no checkpoints/")
        source = found
    if not os.path.isfile(source):
        raise UsageError(f"--checkpoint {source!r} does not exist")
    return _pipeline_from_checkpoint(source, cls)


def _pipeline_from_checkpoint(path: str, cls: type[DiffusionPipeline]) -> DiffusionPipeline:
    try:
        checkpoint = load_checkpoint(path)
    except ValueError as exc:
        raise UsageError(f"--checkpoint {path!r}: {exc}") from None
    config = checkpoint.config
    if config.get("kind") != "ddpm":
        raise UsageError(f"--checkpoint {path!r} is a {config.get('kind')!r} checkpoint, not a diffusion model's")
    vae_path = config.get("vae")
    _check_kind(path, vae_path is not None, cls is LatentDiffusionPipeline)
    unet = UNet2D.from_config(config["unet"])
    _load_averaged_weights(unet, checkpoint.model, checkpoint.ema, path)
    unet.eval()
    scheduler = DDIMScheduler.from_config(config["scheduler"])
    if vae_path is not None:
        return cls(AutoencoderKL.from_pretrained(vae_path), unet, scheduler, config.get("null_class_label"))
    return cls(unet, scheduler, config.get("null_class_label"))


def _load_averaged_weights(unet: UNet2D, model: dict[str, np.ndarray], ema: list[np.ndarray], path: str) -> None:
    """The checkpoint's weights into ``unet``, its parameters then replaced by their averages;
    refused unless both cover every weight of the model with its shape."""
    names = [name for name, _ in unet.named_parameters()]
    missing = [name for name in unet.state_dict() if name not in model]
    missing += [f"ema.{i} ({names[i]})" for i in range(len(ema), len(names))]
    if missing:
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise UsageError(f"--checkpoint {path!r} does not cover the model: {len(missing)} weights missing ({shown})")
    shapes = dict(unet.named_parameters())
    wrong = [f"{name} is {tuple(model[name].shape)}" for name, p in unet.state_dict().items()
             if tuple(model[name].shape) != tuple(p.shape)]
    wrong += [f"ema.{i} ({name}) is {tuple(a.shape)}" for i, (name, a) in enumerate(zip(names, ema))
              if tuple(a.shape) != tuple(shapes[name].shape)]
    if wrong or len(ema) != len(names):
        detail = ", ".join(wrong[:3]) if wrong else f"{len(ema)} averaged weights for {len(names)} parameters"
        raise UsageError(f"--checkpoint {path!r} does not fit the model it describes: {detail}")
    unet.load_state_dict(model)
    with tc.no_grad():
        for parameter, average in zip(unet.parameters(), ema):
            parameter.copy_(tc.tensor(average, device=parameter.device))


def _check_kind(source: str, has_vae: bool, latent: bool) -> None:
    if has_vae and not latent:
        raise UsageError(f"--checkpoint {source!r} is a latent diffusion model: use `python -m diffusion sample-latent`")
    if latent and not has_vae:
        raise UsageError(f"--checkpoint {source!r} is a pixel-space model: use `python -m diffusion sample`")


def sample(args: argparse.Namespace, latent: bool = False) -> None:
    """``sample`` / ``sample-latent``: a grid from a trained model."""
    out = planned_out(args.out, "sample-latent" if latent else "sample")
    check_outputs(out, files=("samples.png",))
    source = args.checkpoint or newest_run()
    pipeline = with_sampler(load_pipeline(source, latent), args.sampler)
    os.makedirs(out, exist_ok=True)
    start = time.perf_counter()
    grid = sample_grid(pipeline, args, os.path.join(out, "samples.png"))
    print(f"sampled {len(args.digits) * args.per_class} images from {source} in "
          f"{_elapsed(time.perf_counter() - start)}; grid: {grid}")


# ----- training ---------------------------------------------------------------------------
def _training_options(args: argparse.Namespace, out: str) -> dict[str, Any]:
    return {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "warmup_steps": args.warmup_steps,
            "grad_clip": args.grad_clip or None, "ema_decay": args.ema_decay, "weight_decay": args.weight_decay,
            "checkpoint_every": args.checkpoint_every, "out_dir": out, "resume": args.resume, "seed": args.seed,
            "log_every": args.log_every, "progress": _progress(args), "compile": COMPILE_CHOICES[args.compile]}


def _engine(model: Any, args: argparse.Namespace) -> str:
    """The backend and whether the train step runs compiled, for the start-up line."""
    device = next(iter(model.parameters())).device
    compiled = compile_enabled(COMPILE_CHOICES[args.compile], device)
    ranks = (f", {distributed.get_world_size()} processes ({distributed.get_backend()})"
             if distributed.is_initialized() else "")
    return f"backend {tc.get_backend().name}, {'compiled' if compiled else 'eager'} train step{ranks}"


def _resumed_config(args: argparse.Namespace, kind: str) -> dict[str, Any] | None:
    """The run description stored in the checkpoint ``--resume`` points at (None without), its
    command-line options restored into ``args``."""
    if args.resume is None:
        return None
    path = args.resume
    if os.path.isdir(path):
        path = latest_checkpoint(path) or latest_checkpoint(os.path.join(path, "checkpoints"))
        if path is None:
            raise UsageError(f"--resume {args.resume!r} holds no checkpoint")
    elif not os.path.isfile(path):
        raise UsageError(f"--resume {args.resume!r} does not exist")
    try:
        config = load_checkpoint(path).config
    except ValueError as exc:
        raise UsageError(f"--resume {args.resume!r}: {exc}") from None
    if config.get("kind") != kind:
        raise UsageError(f"--resume {args.resume!r} is a {config.get('kind')!r} run, not a {kind!r} one")
    restore_options(args, config.get("cli"), args.resume)
    return config


def _checked_out(args: argparse.Namespace, command: str, outputs: dict[str, tuple[str, ...]]) -> str:
    """The run's folder (not created yet), checked: without ``--out`` a resumed run continues
    in the folder it resumes, a fresh one gets ``runs/<command>-<timestamp>``."""
    requested = run_folder(args.resume) if args.out is None and args.resume is not None else args.out
    out = planned_out(requested, command)
    check_outputs(out, **outputs)
    check_not_another_run(out, args.resume)
    return out


def _check_batch_size(args: argparse.Namespace, images: np.ndarray) -> None:
    if args.batch_size > len(images):
        raise UsageError(f"argument --batch-size: {args.batch_size} exceeds the {len(images)} training images")


def _load_vae(path: str) -> AutoencoderKL:
    try:
        return AutoencoderKL.from_pretrained(path)
    except (ValueError, OSError) as exc:
        raise UsageError(f"--vae {path!r}: {exc}") from None


def train(args: argparse.Namespace) -> None:
    """``train``: a class-conditional diffusion model on the digits (in a VAE's latent space with --vae);
    with ``--devices`` > 1 this process is one rank, and rank 0 alone reports and samples."""
    rank = parallel.join(args)
    args.vae = os.path.abspath(args.vae) if args.vae else None
    resumed = _resumed_config(args, "ddpm")
    out = _checked_out(args, "train", TRAIN_OUTPUTS)
    vae = _load_vae(args.vae) if args.vae else None
    image_size = resumed.get("image_size", args.image_size) if resumed else args.image_size
    if vae is not None:
        size = vae.config["sample_size"]
        image_size = int(size if isinstance(size, int) else size[0])
    images, labels = digit_images(image_size)
    _check_batch_size(args, images)
    if vae is not None:
        images = encode_latents(vae, images)
    if resumed:
        unet = UNet2D.from_config(resumed["unet"])
        scheduler = DDPMScheduler.from_config(resumed["scheduler"])
    else:
        check_levels(images.shape[-1], args.channels, "the digits" if vae is None else "the VAE's latents")
        unet = UNet2D(**unet_config(images.shape[-1], args.channels, args.layers_per_block, images.shape[1]))
        scheduler = DDPMScheduler(beta_schedule=args.beta_schedule, prediction_type=args.prediction_type,
                                  clip_sample=vae is None)
    os.makedirs(out, exist_ok=True)
    kind = "latent diffusion" if vae is not None else "diffusion"
    if rank == 0:
        print(f"training a class-conditional {kind} UNet ({sum(p.numel() for p in unet.parameters()):,} "
              f"parameters) on {len(images)} digits at {image_size}x{image_size}, {_engine(unet, args)}; "
              f"output in {out}")
    start = time.perf_counter()
    kernels = train_kernels.shaping_options(args, image_size, latent=vae is not None)
    # on a cold kernel cache, the kernels compile in other processes meanwhile (sampling too)
    with train_kernels.background_compiles(kernels) if rank == 0 else contextlib.nullcontext():
        result = train_ddpm(unet, scheduler, (images, labels), label_dropout=args.label_dropout,
                            null_class_label=NULL_CLASS_LABEL,
                            run_info={"vae": args.vae, "image_size": image_size, "cli": recorded_options(args)},
                            **_training_options(args, out))
        if rank != 0:
            return
        result.ema.copy_to(unet.parameters())
        unet.eval()
        sampler = DDIMScheduler.from_config(scheduler.config)
        pipeline = (LatentDiffusionPipeline(vae, unet, sampler, NULL_CLASS_LABEL) if vae is not None
                    else DiffusionPipeline(unet, sampler, NULL_CLASS_LABEL))
        pipeline.save_pretrained(os.path.join(out, "pipeline"))
        grid = sample_grid(with_sampler(pipeline, args.sampler), args, os.path.join(out, "samples.png"))
    print(f"trained {result.step} steps (final loss {result.losses[-1]:.4f}) and sampled in "
          f"{_elapsed(time.perf_counter() - start)}")
    print(f"samples: {grid}\nloss curve: {result.loss_curve}\nmodel: {os.path.join(out, 'pipeline')}")


def check_levels(size: int, channels: tuple[int, ...], what: str) -> None:
    """Each level halves the side: ``size`` must divide by 2^(levels - 1)."""
    factor = 2 ** (len(channels) - 1)
    if size % factor:
        raise UsageError(f"--channels {','.join(map(str, channels))} has {len(channels)} levels, which need a "
                         f"side divisible by {factor}; {what} are {size}x{size}")


def encode_latents(vae: AutoencoderKL, images: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """The posterior means of ``images``, scaled by the VAE's scaling_factor (the UNet's data)."""
    scale, shift = vae.config["scaling_factor"], vae.config.get("shift_factor") or 0.0
    parts = []
    with tc.no_grad():
        for start in range(0, len(images), batch_size):
            mean = vae.encode(tc.tensor(images[start:start + batch_size])).mean
            parts.append(((mean - shift) * scale).numpy())
    return np.concatenate(parts).astype(np.float32)


def train_vae_command(args: argparse.Namespace) -> None:
    """``train-vae``: an AutoencoderKL on the digits, for ``train --vae``."""
    resumed = _resumed_config(args, "vae")
    out = _checked_out(args, "train-vae", VAE_OUTPUTS)
    image_size = resumed.get("image_size", args.image_size) if resumed else args.image_size
    images, labels = digit_images(image_size)
    _check_batch_size(args, images)
    if not resumed:
        check_levels(image_size, args.channels, "the digits")
    config = resumed["vae"] if resumed else vae_config(image_size, args.channels, args.latent_channels)
    vae = AutoencoderKL.from_config(config)
    os.makedirs(out, exist_ok=True)
    print(f"training an AutoencoderKL ({sum(p.numel() for p in vae.parameters()):,} parameters) on "
          f"{len(images)} digits at {image_size}x{image_size}, {_engine(vae, args)}; output in {out}")
    start = time.perf_counter()
    result = train_vae(vae, images, kl_weight=args.kl_weight,
                       run_info={"image_size": image_size, "cli": recorded_options(args)},
                       **_training_options(args, out))
    result.ema.copy_to(vae.parameters())
    vae.eval()
    scaled = AutoencoderKL.from_config(dict(vae.config), scaling_factor=latent_scaling_factor(vae, images))
    scaled.load_state_dict(vae.state_dict())
    scaled.save_pretrained(os.path.join(out, "vae"))
    first = [int(np.flatnonzero(labels == d)[0]) for d in range(NUM_DIGIT_CLASSES)]
    with tc.no_grad():
        originals = tc.tensor(images[first])
        reconstructed = scaled(originals)
    pair = tc.cat([originals, reconstructed]) * 0.5 + 0.5
    grid = save_png(labelled_rows(pair.clip(0.0, 1.0), ["in", "out"], max(1, round(48 / image_size))),
                    os.path.join(out, "reconstructions.png"))
    print(f"trained {result.step} steps (final loss {result.losses[-1]:.4f}) in "
          f"{_elapsed(time.perf_counter() - start)}, latent scaling_factor {scaled.config['scaling_factor']:.4f}")
    print(f"reconstructions: {grid}\nvae: {os.path.join(out, 'vae')}\n"
          f"next: python -m diffusion train --vae {os.path.join(out, 'vae')}")
