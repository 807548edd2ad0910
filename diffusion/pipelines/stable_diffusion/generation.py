"""One Stable Diffusion call: ``Generation`` with text conditioning, sized latents, an
image-to-image start, diffusers' ``callback_on_step_end`` and its output types.

The pipeline supplies the model-specific parts (``unet_conditioning``, ``image_latents``,
``decode``); this class keeps the order of work diffusers' pipelines follow:
LoRA scale, prompts, the starting latents (drawn, given, or the image's latents noised to
the first step), the steps, then the decode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tensorcore as tc
from tensorcore import Tensor

from ...schedulers.run import SchedulerRun
from ..generation import Generation
from .request import TextRequest

if TYPE_CHECKING:
    from .text_to_image import StableDiffusionPipeline


class TextGeneration(Generation):
    """The state of one call of a Stable Diffusion pipeline."""

    pipeline: StableDiffusionPipeline
    request: TextRequest

    def start_run(self) -> SchedulerRun:
        """The run; image-to-image starts it ``strength`` of the way from the end, as diffusers'
        ``get_timesteps`` does (``int(steps * strength)`` steps are left to take)."""
        run = super().start_run()
        r = self.request
        if r.image is not None:
            steps = r.num_inference_steps
            begin = steps - min(int(steps * r.strength), steps)
            run.set_begin_index(begin * self.pipeline.scheduler.order)
        return run

    def latent_shape(self) -> tuple[int, ...]:
        r, scale = self.request, self.pipeline.vae_scale_factor
        return r.batch_size, self.pipeline.latent_channels, r.height // scale, r.width // scale

    def unet_conditioning(self) -> dict[str, Any]:
        return self.pipeline.unet_conditioning(self.request)

    def prepare(self) -> None:
        """The LoRA scale of the call, the text conditioning, then the starting latents."""
        r = self.request
        with tc.no_grad():
            self.pipeline.set_lora_scale(1.0 if r.lora_scale is None else r.lora_scale)
            self.conditioning = self.unet_conditioning()
            if r.image is None:
                self.sample = self.starting_noise()
            else:
                self.sample = self.pipeline.noised_image_latents(r, self.run)

    def keep_going(self, index: int) -> bool:
        """diffusers' ``callback_on_step_end(pipe, step, timestep, tensors)``: the tensors it asked
        for go in; "latents" in the dict it returns replaces the sample; setting
        ``pipe._interrupt = True`` stops the loop (the images are decoded from where it stopped)."""
        r = self.request
        if r.callback is None:
            return True
        states = self.conditioning["encoder_hidden_states"]
        halves = states.chunk(2) if r.guided else (None, states)
        tensors = {"latents": self.sample, "prompt_embeds": halves[1], "negative_prompt_embeds": halves[0]}
        out = r.callback(self.pipeline, index, self.timestep(index), {k: tensors[k] for k in r.callback_tensors})
        latents = out.get("latents") if isinstance(out, dict) else None
        if latents is not None:
            if not isinstance(latents, Tensor) or latents.shape != self.sample.shape:
                raise ValueError(f"{self.pipeline.name}: callback_on_step_end returned latents of shape "
                                 f"{getattr(latents, 'shape', type(latents).__name__)}, expected {self.sample.shape}")
            self.sample = latents
        return not self.pipeline.interrupt

    def finish(self) -> Tensor:
        """The images in [0, 1] on the device, or the latents themselves for ``output_type="latent"``."""
        if self.request.latent_output:
            return self.sample
        return super().finish()
