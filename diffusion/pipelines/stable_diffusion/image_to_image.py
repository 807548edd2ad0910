"""``StableDiffusionImg2ImgPipeline``: an image and a prompt to a new image, as in diffusers.

The image is encoded by the VAE (a sample of its posterior, drawn from the call's
generator, times the scaling factor), noised to the timestep ``strength`` of the way up
the schedule, and denoised from there over the remaining ``int(steps * strength)`` steps.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorcore as tc
from tensorcore import Tensor

from ...schedulers.run import SchedulerRun
from ..drivers import run_sync
from ..inputs import finite_float
from ..modules import unwrapped
from ..output import ImagePipelineOutput
from .images import image_input
from .request import TextRequest
from .text_to_image import StableDiffusionPipeline, StepCallback


class StableDiffusionImg2ImgPipeline(StableDiffusionPipeline):
    """Image-to-image Stable Diffusion on the same parts as ``StableDiffusionPipeline``."""

    _own_arguments = ("image", "strength")

    def __call__(self, prompt: str | list[str] | None = None, image: Any = None, strength: float = 0.8,
                 num_inference_steps: int = 50, guidance_scale: float = 7.5,
                 negative_prompt: str | list[str] | None = None, num_images_per_prompt: int = 1, eta: float = 0.0,
                 generator: tc.Generator | None = None, prompt_embeds: Tensor | None = None,
                 negative_prompt_embeds: Tensor | None = None, output_type: str = "pil", return_dict: bool = True,
                 cross_attention_kwargs: dict[str, Any] | None = None, guidance_rescale: float = 0.0,
                 clip_skip: int | None = None, callback_on_step_end: StepCallback | None = None,
                 callback_on_step_end_tensor_inputs: Sequence[str] = ("latents",), *, seed: int | None = None,
                 progress: bool = True) -> ImagePipelineOutput | tuple:
        """A new image from ``image`` (PIL, NumPy or Tensor in [0, 1], or latents) and ``prompt``;
        ``strength`` in (0, 1]: how far up the schedule the image is noised (1: all the way,
        the image is only a starting point).  Other arguments as ``StableDiffusionPipeline``."""
        return self._finish(run_sync(self._text_generation(locals())), return_dict)

    def _call_arguments(self, values: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments, with the size taken from the image."""
        arguments = super()._call_arguments(values)
        pixels, is_latent = image_input(values["image"], self.vae_scale_factor, self.latent_channels, self.device,
                                        self.dtype, self.name) if values["image"] is not None else (None, False)
        if pixels is None:
            raise ValueError(f"{self.name}: image is required")
        scale = 1 if not is_latent else self.vae_scale_factor
        arguments.update(image=(pixels, is_latent), height=pixels.shape[2] * scale, width=pixels.shape[3] * scale,
                         latents=None)
        return arguments

    def _checked_own(self, request: TextRequest, image: tuple[Tensor, bool], strength: Any) -> None:
        request.strength = finite_float(self.name, "strength", strength, 0.0, 1.0)
        steps = request.num_inference_steps
        if int(steps * request.strength) < 1:
            raise ValueError(f"{self.name}: strength={strength} leaves no step of num_inference_steps={steps} "
                             f"(int(steps * strength) must be >= 1)")
        pixels, is_latent = image
        count = request.batch_size
        if count % pixels.shape[0]:
            raise ValueError(f"{self.name}: {pixels.shape[0]} images cannot be spread over {count} generated images")
        request.image, request.image_is_latent = pixels, is_latent

    def noised_image_latents(self, r: TextRequest, run: SchedulerRun) -> Tensor:
        """The image's latents (a posterior sample × scaling factor), tiled to the batch as
        diffusers tiles them, noised to the run's first step."""
        latents = r.image
        if not r.image_is_latent:
            vae = unwrapped(self.vae)
            posterior = vae.encode_compiled(r.image) if self.compile else self.vae.encode(r.image)
            latents = posterior.sample(r.generator) * vae.config["scaling_factor"]
        if latents.shape[0] < r.batch_size:
            latents = tc.cat([latents] * (r.batch_size // latents.shape[0]))
        noise = tc.randn(*latents.shape, dtype=latents.dtype, device=r.generator.device,
                         generator=r.generator).to(self.device)
        return run.add_noise(latents, noise)
