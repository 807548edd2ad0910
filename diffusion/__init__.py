"""diffusion: diffusers-style schedulers and models built on tensorcore, and the bundled digits."""

from .datasets import load_digits, train_test_split
from .models import AutoencoderKL, UNet2D
from .schedulers import DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler

__all__ = ["load_digits", "train_test_split", "UNet2D", "AutoencoderKL",
           "DDIMScheduler", "DDPMScheduler", "DPMSolverMultistepScheduler", "EulerDiscreteScheduler"]
