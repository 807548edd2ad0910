"""Noise schedulers with diffusers' names, config keys and numbers.

    from diffusion import DDIMScheduler
    scheduler = DDIMScheduler(beta_schedule="scaled_linear", steps_offset=1)
    run = scheduler.start(50)                  # one generation's timesteps and state
    for t in run.timesteps:
        x = run.step(model(x, t), t, x).prev_sample

``scheduler.set_timesteps(n)`` + ``scheduler.step(...)`` work as in diffusers (one default run).
"""

from .base import SchedulerBase
from .config import Config
from .ddim import DDIMScheduler
from .ddpm import DDPMScheduler
from .dpm_solver import DPMSolverMultistepScheduler
from .euler import EulerDiscreteScheduler
from .euler_ancestral import EulerAncestralDiscreteScheduler
from .lcm import LCMScheduler
from .output import LCMSchedulerOutput, SchedulerOutput
from .pndm import PNDMScheduler
from .run import SchedulerRun
from .unipc import UniPCMultistepScheduler

__all__ = ["Config", "DDIMScheduler", "DDPMScheduler", "DPMSolverMultistepScheduler", "EulerAncestralDiscreteScheduler",
           "EulerDiscreteScheduler", "LCMScheduler", "LCMSchedulerOutput", "PNDMScheduler", "SchedulerBase",
           "SchedulerOutput", "SchedulerRun", "UniPCMultistepScheduler"]
