"""``DiffusionPipeline(unet, scheduler)``: images from noise, in pixel space.

    pipe = DiffusionPipeline(unet, DDIMScheduler.from_config(train_scheduler.config), null_class_label=10)
    result = pipe.generate(batch_size=10, num_inference_steps=50, seed=0, class_labels=range(10),
                           guidance_scale=3.0, output="pil")
    result.images[0].save("digit0.png"); result.nonfinite_count
    result = await pipe.generate_async(...)        # same arguments, same images

Classifier-free guidance runs one UNet call per step on the batch [uncond, cond]
(the null class label, or ``negative_context`` / zeros, for the unconditional half)
and combines ``uncond + scale * (cond - uncond)``; it is on when ``guidance_scale > 1``.
With ``compile`` on (the default on the GPU) each whole step -- that call, the combine,
the scheduler update and the non-finite guard -- is one call of one ``tc.compile`` plan
(``prediction.py``; a few plans per run, each serving many steps) and the VAE decode is
compiled too.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Sequence

import tensorcore as tc
from tensorcore import Tensor

from ..schedulers.run import StepArgs
from .drivers import run_async, run_sync
from .generation import Generation
from .inputs import ModelFacts, Request, check_request, step_parameters
from .modules import model_device, unwrapped
from .output import ImagePipelineOutput
from .prediction import compiled_denoise_step, denoise_step
from .pretrained import load_parts, save_pipeline

Callback = Callable[[int, Any, Tensor], Any]


class DiffusionPipeline:
    """A UNet noise predictor and a scheduler, sampled with ``generate`` / ``generate_async``.

    ``null_class_label``: the class label the UNet was trained with for "no class"
    (label dropout); needed for guidance with class labels, and used for unconditional
    samples of a class-conditioned model.
    ``compile``: run each denoising step (UNet call, guidance combine, scheduler update,
    non-finite guard) as one call of a ``tc.compile`` plan (``denoiser``), and the VAE
    decode as a compiled plan; same images as eager.  None:
    on when the UNet is a plain module on the GPU.  A wrapped UNet (``tc.compile``d or
    other) is called as given unless ``compile=True``, which compiles the module behind it.
    """

    def __init__(self, unet: Any, scheduler: Any, null_class_label: int | None = None,
                 compile: bool | None = None) -> None:  # noqa: A002  (the option's public name)
        name = type(self).__name__
        module = unwrapped(unet)
        if not callable(unet) or not hasattr(module, "config"):
            raise TypeError(f"{name}: unet must be a UNet2D (or a compiled one), got {type(unet).__name__}")
        if not all(callable(getattr(scheduler, method, None)) for method in ("start", "step_update")):
            raise TypeError(f"{name}: scheduler must be a diffusion scheduler (with start() and step_update()), "
                            f"got {type(scheduler).__name__}")
        classes = module.config.get("num_class_embeds")
        if null_class_label is not None:
            if not isinstance(null_class_label, numbers.Integral) or isinstance(null_class_label, bool) \
                    or classes is None or not 0 <= null_class_label < classes:
                raise ValueError(f"{name}: null_class_label must be an int in [0, num_class_embeds="
                                 f"{classes}), got {null_class_label!r}")
            null_class_label = int(null_class_label)
        if compile is not None and not isinstance(compile, bool):
            raise TypeError(f"{name}: compile must be True, False or None, got {compile!r}")
        self.unet, self.scheduler, self.null_class_label = unet, scheduler, null_class_label
        if compile is None:  # compiled by default on the GPU, unless the caller wrapped the UNet already
            compile = model_device(module).startswith("cuda") and module is unet
        self.compile = compile
        self.denoiser = compiled_denoise_step() if compile else None

    def denoise(self, sample: Tensor, timestep: Tensor, args: StepArgs, conditioning: dict[str, Any],
                guidance_scale: float | None, total: Tensor, guidance_rescale: float = 0.0) -> tuple[Tensor, ...]:
        """One denoising step (``denoise_step``): one compiled call when ``compile`` is on (on the
        UNet module itself), else the UNet as given; (next sample, guard count[, x̂₀])."""
        step_args = (self.scheduler, sample, timestep, args.values, args.history, total, conditioning,
                     guidance_scale, guidance_rescale, args.variant, args.noise, args.noise_dtype,
                     self.scheduler.solver_history)
        if self.denoiser is not None:
            return self.denoiser(unwrapped(self.unet), *step_args)
        return denoise_step(self.unet, *step_args)

    # ----- what the generation needs to know ------------------------------------------
    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def device(self) -> str:
        return model_device(self.unet)

    @property
    def dtype(self) -> Any:
        return next(iter(unwrapped(self.unet).parameters())).dtype

    def latent_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the denoised sample, from the UNet's config."""
        config = unwrapped(self.unet).config
        size = config["sample_size"]
        height, width = (size, size) if isinstance(size, numbers.Integral) else tuple(size)
        return int(config["in_channels"]), int(height), int(width)

    def decode(self, sample: Tensor) -> Tensor:
        """The final sample as images in [-1, 1] (pixel space: the sample itself)."""
        return sample

    def _facts(self) -> ModelFacts:
        config = unwrapped(self.unet).config
        levels = len(config["block_out_channels"])
        return ModelFacts(
            name=self.name, device=self.device,
            latent_shape=self.latent_shape() if config.get("sample_size") is not None else None,
            latent_channels=int(config["in_channels"]), size_multiple=2 ** (levels - 1),
            num_class_embeds=config.get("num_class_embeds"), null_class_label=self.null_class_label,
            cross_attention_dim=config.get("cross_attention_dim"),
            num_train_timesteps=int(self.scheduler.config["num_train_timesteps"]),
            step_parameters=_step_options(self.scheduler))

    def _generation(self, *args: Any) -> Generation:
        request: Request = check_request(self._facts(), *args)
        return Generation(self, request)

    # ----- generate -----------------------------------------------------------------
    def generate(self, batch_size: int = 1, num_inference_steps: int = 50, seed: int | None = None,
                 generator: tc.Generator | None = None, eta: float = 0.0, guidance_scale: float = 1.0,
                 class_labels: int | Sequence[int] | Tensor | None = None, context: Tensor | None = None,
                 latents: Tensor | None = None, output: str = "tensor", progress: bool = True,
                 callback: Callback | None = None, negative_context: Tensor | None = None
                 ) -> ImagePipelineOutput:
        """Denoise ``batch_size`` samples over ``num_inference_steps`` scheduler steps.

        Same ``seed`` (or a generator in the same state) -> the same images.  ``eta``:
        DDIM's noise level (0 = deterministic).  ``class_labels``: one int or one per
        sample.  ``context``: [B, L, D] for a cross-attention UNet.  ``latents``: the
        starting noise instead of drawing it.  ``output``: "tensor" | "numpy" | "pil".
        ``callback(step, t, sample)`` runs after every step; returning False stops the
        loop there (the images are then decoded from the partly denoised sample).
        Every argument is checked before any work starts.
        """
        return run_sync(self._generation(batch_size, num_inference_steps, seed, generator, eta, guidance_scale,
                                         class_labels, context, negative_context, latents, output, progress,
                                         callback))

    async def generate_async(self, batch_size: int = 1, num_inference_steps: int = 50, seed: int | None = None,
                             generator: tc.Generator | None = None, eta: float = 0.0, guidance_scale: float = 1.0,
                             class_labels: int | Sequence[int] | Tensor | None = None,
                             context: Tensor | None = None, latents: Tensor | None = None, output: str = "tensor",
                             progress: bool = True, callback: Callback | None = None,
                             negative_context: Tensor | None = None) -> ImagePipelineOutput:
        """``generate`` under asyncio, bit-identical to it; cancellation stops it at the next step."""
        generation = self._generation(batch_size, num_inference_steps, seed, generator, eta, guidance_scale,
                                      class_labels, context, negative_context, latents, output, progress,
                                      callback)
        return await run_async(generation)

    __call__ = generate

    # ----- folders ------------------------------------------------------------------
    def save_pretrained(self, folder: str) -> None:
        """Write the pipeline as a diffusers-style folder (model_index.json, unet/, scheduler/, vae/)."""
        save_pipeline(self, folder)

    @classmethod
    def from_pretrained(cls, folder: str, scheduler: Any = None, device: str | None = None,
                        compile: bool | None = None) -> "DiffusionPipeline":  # noqa: A002
        """The pipeline saved in ``folder`` (with ``scheduler`` instead of the stored one if given)."""
        parts = load_parts(folder, scheduler, device)
        return cls._from_parts(folder, parts, compile)

    @classmethod
    def _from_parts(cls, folder: str, parts: dict[str, Any],
                    compile: bool | None) -> "DiffusionPipeline":  # noqa: A002
        if parts["vae"] is not None:
            raise ValueError(f"DiffusionPipeline.from_pretrained: {folder!r} holds a latent pipeline (it has a "
                             f"VAE); load it with LatentDiffusionPipeline.from_pretrained")
        return cls(parts["unet"], parts["scheduler"], parts["null_class_label"], compile=compile)


def _step_options(scheduler: Any) -> frozenset[str]:
    """The keywords the scheduler's step takes (``run.step`` forwards ``**kwargs`` to it)."""
    return step_parameters(getattr(scheduler, "_step", scheduler.step))
