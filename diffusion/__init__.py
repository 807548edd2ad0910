"""diffusion: pipelines built on tensorcore: the bundled digits, a demo run, and diffusers-style models."""

from .datasets import load_digits, train_test_split
from .models import AutoencoderKL, UNet2D
from .schedulers import DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler

__all__ = ["load_digits", "train_test_split", "UNet2D", "AutoencoderKL",
           "DDIMScheduler", "DDPMScheduler", "DPMSolverMultistepScheduler", "EulerDiscreteScheduler"]
