"""One ``generate`` call: its own scheduler run, sample and non-finite guard.

Nothing here writes to the pipeline, its models or its scheduler (the scheduler's
per-generation state lives in the run), so any number of generations can be in
flight on one pipeline.  ``prepare``, ``step`` and ``finish`` do device work only;
``collect`` is the single host read at the end.  The sync and async drivers call the
same methods in the same order, so their results are bit-identical.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

import tensorcore as tc
from tensorcore import Tensor

from ..images import to_pil
from ..schedulers.run import SchedulerRun
from .guard import NonFiniteGuard
from .inputs import Request
from .output import ImagePipelineOutput

if TYPE_CHECKING:
    from .pipeline import DiffusionPipeline


class Generation:
    """The state of one generation on ``pipeline``, checked by ``request``."""

    def __init__(self, pipeline: DiffusionPipeline, request: Request) -> None:
        self.pipeline, self.request = pipeline, request
        self.device = pipeline.device
        self.run = self.start_run()
        self.first = self.run.position  # image-to-image starts part-way down the schedule
        self.guard = NonFiniteGuard()
        self.sample: Tensor | None = None
        self.steps_run = 0
        self.conditioning: dict[str, Any] = {}

    def start_run(self) -> SchedulerRun:
        """The generation's own scheduler run."""
        return self.pipeline.scheduler.start(self.request.num_inference_steps, device=self.device)

    @property
    def num_steps(self) -> int:
        """The run's timesteps from where it starts: more than ``num_inference_steps`` for
        PNDM (its repeated or Runge-Kutta timesteps), as diffusers' loops go over
        ``scheduler.timesteps``."""
        return len(self.run) - self.first

    def unet_conditioning(self) -> dict[str, Any]:
        """The UNet's keyword arguments beside sample and timestep: class labels and
        context, [uncond, cond] stacked when guiding."""
        r = self.request
        labels, context = r.class_labels, r.context
        if r.guided and labels is not None:
            null = tc.full((r.batch_size,), self.pipeline.null_class_label, dtype=tc.int64, device=self.device)
            labels = tc.cat([null, labels])
        if r.guided and context is not None:
            negative = r.negative_context if r.negative_context is not None else tc.zeros_like(context)
            context = tc.cat([negative, context])
        return {"class_labels": labels, "context": context}

    def prepare(self) -> None:
        """The UNet's conditioning, and the starting sample: the given latents or noise from
        the generator, times the scheduler's initial sigma."""
        with tc.no_grad():
            self.conditioning = self.unet_conditioning()
            self.sample = self.starting_noise()

    def latent_shape(self) -> tuple[int, ...]:
        """The shape of the sample: [B, C, H, W]."""
        return (self.request.batch_size,) + self.pipeline.latent_shape()

    def starting_noise(self) -> Tensor:
        """The given latents, or noise drawn from the request's generator, times the run's
        initial sigma."""
        r = self.request
        if r.latents is not None:
            x = r.latents
        else:
            x = tc.randn(*self.latent_shape(), dtype=self.pipeline.dtype, device=r.generator.device,
                         generator=r.generator).to(self.device)
        sigma = self.run.init_noise_sigma
        return x * sigma if sigma != 1.0 else x

    def step(self, index: int) -> None:
        """Denoising step ``index`` (counted from where the run starts): one ``denoise_step``
        (the UNet call, batched [uncond, cond] when guiding, the guidance combine, the
        scheduler update and the non-finite guard), compiled or eager as the pipeline says;
        the run moves on on the host."""
        r, run = self.request, self.run
        args = run.prepare_step(self.sample, **r.step_kwargs)
        if isinstance(args.noise, tc.Generator) and (r.owns_generator or args.noise.device != self.device):
            # a generator made for this call (or on another device) is not bound into a plan:
            # its noise is drawn here, the step takes it as an input
            args = args.with_noise_drawn(self.sample, self.pipeline.dtype)
        with tc.no_grad():
            out = self.pipeline.denoise(self.sample, run.timesteps[self.first + index], args, self.conditioning,
                                        r.guidance_scale if r.guided else None,
                                        self.guard.running_total(self.device), r.guidance_rescale)
        self.sample, self.guard.total = out[0], out[1]
        run.finish_step(out[2] if len(out) > 2 else None)
        self.steps_run = index + 1

    def timestep(self, index: int) -> int | float:
        """The host value of step ``index``'s timestep (for callbacks)."""
        return self.run.timestep_at(self.first + index)

    def keep_going(self, index: int) -> bool:
        """Call the callback after step ``index``; False when it asks to stop."""
        callback = self.request.callback
        return callback is None or callback(index, self.timestep(index), self.sample) is not False

    def finish(self) -> Tensor:
        """The images in [0, 1] on the device (decoded for latent pipelines), guarded."""
        with tc.no_grad():
            images = self.guard(self.pipeline.decode(self.sample))
            return (images * 0.5 + 0.5).clip(0.0, 1.0)

    def collect(self, images: Tensor) -> ImagePipelineOutput:
        """Read the non-finite count (one warning when it is not zero) and convert the images."""
        count = self.guard.count()
        if count:
            warnings.warn(f"{self.pipeline.name}: the generation produced {count} non-finite values "
                          f"(NaN set to 0, ±Inf to the largest finite value); they were replaced and "
                          f"counted in result.nonfinite_count", RuntimeWarning, stacklevel=4)
        output = self.request.output
        if output == "numpy":
            images = images.numpy().astype(np.float32).transpose(0, 2, 3, 1)
        elif output == "pil":
            images = to_pil(images)
        return ImagePipelineOutput(images=images, nonfinite_count=count, steps_run=self.steps_run)

