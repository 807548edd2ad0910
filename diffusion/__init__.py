"""diffusion: diffusers-style schedulers, models and pipelines built on tensorcore, training
loops, and the bundled digits."""

from .datasets import load_digits, train_test_split
from .models import (AutoencoderKL, CLIPTextModel, CLIPTextModelWithProjection, UNet2D, UNet2DConditionModel,
                     get_guidance_scale_embedding)
from .pipelines import (DiffusionPipeline, ImagePipelineOutput, LatentDiffusionPipeline, StableDiffusionImg2ImgPipeline,
                        StableDiffusionPipeline, StableDiffusionXLPipeline)
from .schedulers import (DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                         EulerDiscreteScheduler, LCMScheduler, PNDMScheduler, UniPCMultistepScheduler)
from .tokenizers import CLIPTokenizer
from .training import train_ddpm, train_vae

__all__ = ["load_digits", "train_test_split", "UNet2D", "UNet2DConditionModel", "AutoencoderKL",
           "CLIPTextModel", "CLIPTextModelWithProjection", "CLIPTokenizer",
           "DiffusionPipeline", "LatentDiffusionPipeline", "ImagePipelineOutput",
           "StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline", "StableDiffusionXLPipeline",
           "DDIMScheduler", "DDPMScheduler", "DPMSolverMultistepScheduler", "EulerAncestralDiscreteScheduler",
           "EulerDiscreteScheduler", "LCMScheduler", "PNDMScheduler", "UniPCMultistepScheduler",
           "get_guidance_scale_embedding",
           "train_ddpm", "train_vae"]
