"""diffusion: diffusers-style schedulers, models and pipelines built on tensorcore, training
loops, and the bundled digits."""

from .datasets import load_digits, train_test_split
from .models import AutoencoderKL, CLIPTextModel, CLIPTextModelWithProjection, UNet2D, UNet2DConditionModel
from .pipelines import DiffusionPipeline, ImagePipelineOutput, LatentDiffusionPipeline
from .schedulers import (DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                         EulerDiscreteScheduler, PNDMScheduler)
from .tokenizers import CLIPTokenizer
from .training import train_ddpm, train_vae

__all__ = ["load_digits", "train_test_split", "UNet2D", "UNet2DConditionModel", "AutoencoderKL",
           "CLIPTextModel", "CLIPTextModelWithProjection", "CLIPTokenizer",
           "DiffusionPipeline", "LatentDiffusionPipeline", "ImagePipelineOutput",
           "DDIMScheduler", "DDPMScheduler", "DPMSolverMultistepScheduler", "EulerAncestralDiscreteScheduler",
           "EulerDiscreteScheduler", "PNDMScheduler",
           "train_ddpm", "train_vae"]
