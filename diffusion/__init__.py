"""diffusion: pipelines built on tensorcore; for now the bundled digits and a demo run."""

from .datasets import load_digits, train_test_split
from .schedulers import DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler

__all__ = ["load_digits", "train_test_split",
           "DDIMScheduler", "DDPMScheduler", "DPMSolverMultistepScheduler", "EulerDiscreteScheduler"]
