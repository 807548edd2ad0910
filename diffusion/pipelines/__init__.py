"""Pipelines: a UNet and a scheduler (and a VAE for latent diffusion) sampled end to end."""

from .guard import NonFiniteGuard
from .latent import LatentDiffusionPipeline
from .output import ImagePipelineOutput
from .pipeline import DiffusionPipeline
from .stable_diffusion import StableDiffusionImg2ImgPipeline, StableDiffusionPipeline, StableDiffusionXLPipeline

__all__ = ["DiffusionPipeline", "ImagePipelineOutput", "LatentDiffusionPipeline", "NonFiniteGuard",
           "StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline", "StableDiffusionXLPipeline"]
