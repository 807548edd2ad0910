"""``train_ddpm``: teach a UNet to denoise, as in DDPM (Ho et al. 2020) with the simple loss.

Each step draws, per image, a timestep t uniformly from the scheduler's training
range and Gaussian noise ε, forms x_t = ``scheduler.add_noise(x₀, ε, t)`` and
regresses the UNet's output on the target of the scheduler's ``prediction_type``:
ε (``epsilon``), v = ``scheduler.get_velocity(x₀, ε, t)`` (``v_prediction``) or x₀
(``sample``).  For classifier-free guidance the class label is replaced by the null
label with probability ``label_dropout``, so one network learns both the conditional
and the unconditional model.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

import tensorcore as tc
import tensorcore.functional as F
from tensorcore import Tensor

from .loop import Trainer, TrainResult
from .options import split_options

PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")


def train_ddpm(unet: Any, scheduler: Any, data: Any, *, label_dropout: float = 0.1,
               null_class_label: int | None = None, run_info: dict[str, Any] | None = None,
               **options: Any) -> TrainResult:
    """Train ``unet`` on ``data`` (images ``[N, C, H, W]`` in [-1, 1], or ``(images, labels)``).

    ``scheduler`` gives the noise schedule and the prediction type.  For a class-conditioned
    UNet (``num_class_embeds``), labels are required; with ``label_dropout > 0`` the null label
    is ``null_class_label`` (default: the last class embedding, ``num_class_embeds - 1``,
    which the data's labels must then leave unused).

    Training options (keywords, see ``TrainOptions``): ``steps`` (3000), ``batch_size`` (64),
    ``lr`` (2e-3, AdamW), ``weight_decay`` (0), ``betas``, ``warmup_steps`` (100, then cosine
    decay to ``min_lr``), ``grad_clip`` (1.0, None for none), ``ema_decay`` (0.999),
    ``out_dir`` (checkpoints every ``checkpoint_every`` steps, keeping ``keep_checkpoints``,
    ``metrics.csv`` and ``loss.png``), ``resume`` (a checkpoint file, a folder, or True for
    out_dir's latest), ``seed``, ``log_every``, ``progress``, ``callback(step)`` (return False
    to stop), ``compile`` (True, False or "auto" = on, except on the CPU with the NumPy
    reference backend: the step runs as one ``tc.compile``d call, see ``Trainer``).
    ``run_info``: extra JSON data stored in every checkpoint.  Returns a ``TrainResult``;
    sample with its EMA weights (``result.ema.copy_to(unet.parameters())``).
    """
    return ddpm_trainer(unet, scheduler, data, label_dropout=label_dropout,
                        null_class_label=null_class_label, run_info=run_info, **options).run()


def ddpm_trainer(unet: Any, scheduler: Any, data: Any, *, label_dropout: float = 0.1,
                 null_class_label: int | None = None, run_info: dict[str, Any] | None = None,
                 **options: Any) -> Trainer:
    """The ``Trainer`` ``train_ddpm`` runs, with the same arguments, checked; call its
    ``run()``, or ``train_step()`` one step at a time (benchmarks interleave two)."""
    train_options, unknown = split_options(options)
    if unknown:
        raise TypeError(f"train_ddpm: unknown options {sorted(unknown)}")
    config = unet.config
    prediction_type = scheduler.config["prediction_type"]
    if prediction_type not in PREDICTION_TYPES:
        raise ValueError(f"train_ddpm: the scheduler's prediction_type must be one of {PREDICTION_TYPES}, "
                         f"got {prediction_type!r}")
    device = next(iter(unet.parameters())).device
    images, labels = dataset_tensors("train_ddpm", data, config["in_channels"], device)
    classes = config.get("num_class_embeds")
    null = _null_label(classes, labels, label_dropout, null_class_label)
    timesteps = int(scheduler.config["num_train_timesteps"])

    def loss_fn(batch: tuple[Tensor, ...], generator: tc.Generator) -> Tensor:
        x0 = batch[0]
        size = x0.shape[0]
        noise = tc.randn(*x0.shape, dtype=x0.dtype, device=x0.device, generator=generator)
        t = tc.randint(0, timesteps, (size,), device=x0.device, generator=generator)
        class_labels = batch[1] if len(batch) > 1 else None
        if class_labels is not None and label_dropout > 0:
            dropped = tc.rand(size, device=x0.device, generator=generator) < label_dropout
            class_labels = tc.where(dropped, tc.full((size,), null, dtype=tc.int64, device=x0.device), class_labels)
        noisy = scheduler.add_noise(x0, noise, t)
        if prediction_type == "epsilon":
            target = noise
        elif prediction_type == "v_prediction":
            target = scheduler.get_velocity(x0, noise, t)
        else:
            target = x0
        return F.mse_loss(unet(noisy, t, class_labels=class_labels), target)

    description = {"kind": "ddpm", "unet": config.to_json_dict(),
                   "scheduler": {**scheduler.config, "_class_name": type(scheduler).__name__},
                   "null_class_label": null, "label_dropout": float(label_dropout),
                   "options": train_options.describe(), **(run_info or {})}
    tensors = (images,) if labels is None else (images, labels)
    return Trainer(unet, loss_fn, tensors, train_options, description)


def dataset_tensors(op: str, data: Any, channels: int, device: str) -> tuple[Tensor, Tensor | None]:
    """``data`` (images, or (images, labels)) as float32 / int64 tensors on ``device``, checked."""
    images, labels = (data if isinstance(data, tuple) and len(data) == 2 else (data, None))
    images = images.to(device).float() if isinstance(images, Tensor) else tc.tensor(
        np.asarray(images, np.float32), device=device)
    if images.ndim != 4 or images.shape[1] != channels or images.shape[0] < 1:
        raise ValueError(f"{op}: images must be [N, {channels}, H, W] with N >= 1, got {images.shape}")
    if labels is not None:
        values = labels.numpy() if isinstance(labels, Tensor) else np.asarray(labels)
        if values.dtype.kind not in "iu" or values.shape != (images.shape[0],):
            raise ValueError(f"{op}: labels must be {images.shape[0]} integers, got {values.dtype} {values.shape}")
        labels = tc.tensor(values.astype(np.int64), device=device)
    return images, labels


def _null_label(classes: int | None, labels: Tensor | None, label_dropout: Any, null: Any) -> int | None:
    """Check labels against the UNet's class embedding; the null label used for dropout."""
    if not isinstance(label_dropout, numbers.Real) or not 0.0 <= label_dropout < 1.0:
        raise ValueError(f"train_ddpm: label_dropout must be in [0, 1), got {label_dropout!r}")
    if classes is None:
        if labels is not None:
            raise ValueError("train_ddpm: labels given, but the UNet has no class embedding (num_class_embeds)")
        return None
    if labels is None:
        raise ValueError(f"train_ddpm: the UNet is class-conditioned ({classes} class embeddings): "
                         f"pass data as (images, labels)")
    if label_dropout > 0 or null is not None:
        null = classes - 1 if null is None else null
        if not isinstance(null, numbers.Integral) or not 0 <= null < classes:
            raise ValueError(f"train_ddpm: null_class_label must be an int in [0, {classes}), got {null!r}")
    values = labels.numpy()
    if values.min() < 0 or values.max() >= classes or (null is not None and np.any(values == null)):
        reserved = f" other than the null label {null}" if null is not None else ""
        raise ValueError(f"train_ddpm: labels must lie in [0, {classes}){reserved} (the UNet's class "
                         f"embeddings), got values in [{values.min()}, {values.max()}]")
    return None if null is None else int(null)
