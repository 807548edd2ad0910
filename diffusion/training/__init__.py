"""Training: ``train_ddpm`` (a UNet noise predictor) and ``train_vae`` (an AutoencoderKL), with
EMA, AdamW under warmup + cosine, gradient clipping, atomic checkpoints and exact resume."""

from .checkpoint import Checkpoint, latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from .ddpm import ddpm_trainer, train_ddpm
from .ema import EMAModel
from .loop import Trainer, TrainResult, warmup_cosine
from .options import TrainOptions
from .vae import latent_scaling_factor, train_vae

__all__ = ["Checkpoint", "EMAModel", "TrainOptions", "TrainResult", "Trainer", "ddpm_trainer", "latent_scaling_factor",
           "latest_checkpoint", "list_checkpoints", "load_checkpoint", "save_checkpoint", "train_ddpm",
           "train_vae", "warmup_cosine"]
