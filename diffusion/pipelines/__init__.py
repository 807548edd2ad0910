"""Pipelines: a UNet and a scheduler (and a VAE for latent diffusion) sampled end to end."""

from .guard import NonFiniteGuard
from .latent import LatentDiffusionPipeline
from .output import ImagePipelineOutput
from .pipeline import DiffusionPipeline

__all__ = ["DiffusionPipeline", "ImagePipelineOutput", "LatentDiffusionPipeline", "NonFiniteGuard"]
