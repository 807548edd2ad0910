"""``train_vae``: fit an AutoencoderKL to images (reconstruction + a small KL term).

The loss per batch is the mean squared reconstruction error of ``decode(z)``, z drawn
from the posterior ``encode(x)``, plus ``kl_weight`` times the KL divergence to N(0, I)
per image pixel.  A small KL weight keeps the latent space smooth enough to diffuse
in while reconstructions stay sharp; ``latent_scaling_factor`` then measures the
``scaling_factor`` that gives the latents unit variance, as Stable Diffusion's VAE has.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import tensorcore as tc
import tensorcore.functional as F
from tensorcore import Tensor

from .ddpm import dataset_tensors
from .loop import Trainer, TrainResult
from .options import split_options


def train_vae(vae: Any, data: Any, *, kl_weight: float = 1e-3, run_info: dict[str, Any] | None = None,
              **options: Any) -> TrainResult:
    """Train ``vae`` on ``data`` (images ``[N, C, H, W]`` in [-1, 1]; labels, if given, are unused).

    Training options as for ``train_ddpm`` (``steps``, ``batch_size``, ``lr``, ``out_dir``,
    ``resume``, ...); ``run_info``: extra JSON data for the checkpoints.  Returns a
    ``TrainResult`` whose EMA holds the averaged weights.
    """
    train_options, unknown = split_options(options)
    if unknown:
        raise TypeError(f"train_vae: unknown options {sorted(unknown)}")
    if not isinstance(kl_weight, numbers.Real) or not kl_weight >= 0 or not math.isfinite(kl_weight):
        raise ValueError(f"train_vae: kl_weight must be a finite number >= 0, got {kl_weight!r}")
    device = next(iter(vae.parameters())).device
    images, _ = dataset_tensors("train_vae", data, vae.config["in_channels"], device)
    pixels = images.shape[1] * images.shape[2] * images.shape[3]

    def loss_fn(batch: tuple[Tensor, ...], generator: tc.Generator) -> Tensor:
        x = batch[0]
        posterior = vae.encode(x)
        reconstruction = vae.decode(posterior.sample(generator))
        return F.mse_loss(reconstruction, x) + posterior.kl().mean() * (kl_weight / pixels)

    description = {"kind": "vae", "vae": vae.config.to_json_dict(), "kl_weight": float(kl_weight),
                   "options": train_options.describe(), **(run_info or {})}
    return Trainer(vae, loss_fn, (images,), train_options, description).run()


def latent_scaling_factor(vae: Any, images: Any, batch_size: int = 256) -> float:
    """1 / std of the posterior means of ``images``: the ``scaling_factor`` that gives the
    diffusion model latents of unit variance."""
    device = next(iter(vae.parameters())).device
    x, _ = dataset_tensors("latent_scaling_factor", images, vae.config["in_channels"], device)
    total, total_sq, count = 0.0, 0.0, 0
    with tc.no_grad():
        for start in range(0, x.shape[0], batch_size):
            mean = vae.encode(x[start:start + batch_size]).mean.double()
            total += float(mean.sum().item())
            total_sq += float((mean * mean).sum().item())
            count += mean.numel()
    variance = max(total_sq / count - (total / count) ** 2, 1e-12)
    return 1.0 / math.sqrt(variance)
