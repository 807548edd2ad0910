"""``LatentDiffusionPipeline(vae, unet, scheduler)``: denoise in the VAE's latent space, then decode.

The UNet works on latents scaled as in Stable Diffusion, ``(z - shift_factor) *
scaling_factor``; the final latents are unscaled and decoded by the VAE (tiled or
sliced if the VAE has that switched on; ``vae.decode_compiled`` when ``compile`` is on).
Generation is ``DiffusionPipeline``'s.
"""

from __future__ import annotations

from typing import Any

from tensorcore import Tensor

from .modules import model_device, unwrapped
from .pipeline import DiffusionPipeline


class LatentDiffusionPipeline(DiffusionPipeline):
    """``generate`` / ``generate_async`` as for ``DiffusionPipeline``; images come from ``vae.decode``."""

    def __init__(self, vae: Any, unet: Any, scheduler: Any, null_class_label: int | None = None,
                 compile: bool | None = None) -> None:  # noqa: A002
        super().__init__(unet, scheduler, null_class_label, compile)
        vae_module = unwrapped(vae)
        if not callable(getattr(vae_module, "decode", None)) or not hasattr(vae_module, "config"):
            raise TypeError(f"LatentDiffusionPipeline: vae must be an AutoencoderKL, got {type(vae).__name__}")
        latent_channels, unet_channels = vae_module.config["latent_channels"], unwrapped(unet).config["in_channels"]
        if latent_channels != unet_channels:
            raise ValueError(f"LatentDiffusionPipeline: the UNet takes {unet_channels} channels, the VAE's "
                             f"latents have {latent_channels}")
        if model_device(vae_module) != self.device:
            raise ValueError(f"LatentDiffusionPipeline: the VAE is on {model_device(vae_module)}, "
                             f"the UNet on {self.device}")
        self.vae = vae

    def unscaled(self, sample: Tensor) -> Tensor:
        """The final latents as the VAE decodes them: divided by its scaling factor (plus its shift)."""
        config = unwrapped(self.vae).config
        latents = sample * (1.0 / config["scaling_factor"])
        return latents + config["shift_factor"] if config.get("shift_factor") is not None else latents

    def decode(self, sample: Tensor) -> Tensor:
        latents = self.unscaled(sample)
        if self.compile:
            return unwrapped(self.vae).decode_compiled(latents)
        return self.vae.decode(latents)

    @classmethod
    def _from_parts(cls, folder: str, parts: dict[str, Any],
                    compile: bool | None) -> "LatentDiffusionPipeline":  # noqa: A002
        if parts["vae"] is None:
            raise ValueError(f"LatentDiffusionPipeline.from_pretrained: {folder!r} has no vae/; "
                             f"load a pixel-space pipeline with DiffusionPipeline.from_pretrained")
        return cls(parts["vae"], parts["unet"], parts["scheduler"], parts["null_class_label"], compile=compile)
