"""``StableDiffusionPipeline``: text to image with a Stable Diffusion 1.x/2.x folder, called as in diffusers.

    pipe = StableDiffusionPipeline.from_pretrained("stable-diffusion-v1-5", dtype=tc.float16, device="cuda")
    image = pipe("an astronaut riding a horse", num_inference_steps=30, seed=0).images[0]
    pipe.load_lora_weights("style.safetensors"); pipe.fuse_lora(0.8)

The text encoder (``tokenizer`` + CLIP), the denoising loop (``Generation``: one
``denoise_step`` per timestep -- the UNet on [uncond, cond], the guidance combine and
``guidance_rescale``, the scheduler update and the non-finite guard) and the VAE decode.
With ``compile`` on (the default on the GPU) the three are the stages of one ``tc.chain``
(``pipe.chain``): the text stage runs once per prompt batch, the denoise stage replays one
plan per step (one CUDA graph on the GPU), the decode stage once; each stage keeps its own
plans and retraces alone when its model's structure changes (a LoRA loaded or fused).
"""

from __future__ import annotations

import inspect
import os
from dataclasses import replace
from typing import Any, Callable, Sequence

import tensorcore as tc
from tensorcore import Tensor

from ...lora import LoraLoaderMixin
from ...models import get_guidance_scale_embedding
from ..drivers import run_async, run_sync
from ..inputs import ModelFacts
from ..latent import LatentDiffusionPipeline
from ..modules import unwrapped
from ..output import ImagePipelineOutput
from .folders import load_components, save_components
from .generation import TextGeneration
from .prompts import PromptStates, encode_prompt, encode_text
from .request import TextRequest, check_text_request

StepCallback = Callable[[Any, int, Any, dict], Any]


class StableDiffusionPipeline(LatentDiffusionPipeline, LoraLoaderMixin):
    """Text-to-image Stable Diffusion: ``vae``, ``text_encoder``, ``tokenizer``, ``unet``, ``scheduler``.

    Called with diffusers' arguments (``__call__``), or under asyncio with the same ones
    (``generate_async``); returns an ``ImagePipelineOutput`` (``images``, and the count of
    non-finite values the guard replaced).  No safety checker runs.
    """

    _parts: tuple[str, ...] = ("vae", "text_encoder", "tokenizer", "unet", "scheduler")
    _optional: tuple[str, ...] = ()

    def __init__(self, vae: Any, text_encoder: Any, tokenizer: Any, unet: Any, scheduler: Any,
                 compile: bool | None = None) -> None:  # noqa: A002  (the option's public name)
        super().__init__(vae, unet, scheduler, None, compile)
        self.text_encoder, self.tokenizer = text_encoder, tokenizer
        self._check_text_parts(self.text_pairs())
        self._interrupt = False
        self.hoist_text_states = True  # cross-attention keys and values of the text: once per generation
        self.text_stage = tc.compile(encode_text, fallback="eager") if self.compile else encode_text
        self.chain = tc.chain(self.text_stage, self.denoiser, unwrapped(vae).compiled("decode")) if self.compile \
            else None

    def text_pairs(self) -> list[tuple[Any, Any]]:
        """The (text encoder, tokenizer) pairs, in the order their states are concatenated."""
        return [(self.text_encoder, self.tokenizer)]

    def _check_text_parts(self, pairs: Sequence[tuple[Any, Any]]) -> None:
        """Each (text encoder, tokenizer) pair must be a CLIP text model and a tokenizer, and the
        encoders' widths must add up to the UNet's cross-attention width."""
        widths = []
        for encoder, tokenizer in pairs:
            module = unwrapped(encoder)
            if not hasattr(module, "text_model") or not callable(module):
                raise TypeError(f"{self.name}: text_encoder must be a CLIPTextModel, got {type(encoder).__name__}")
            if not callable(getattr(tokenizer, "encode", None)) or getattr(tokenizer, "model_max_length", None) is None:
                raise TypeError(f"{self.name}: tokenizer must be a CLIPTokenizer with a model_max_length, "
                                f"got {type(tokenizer).__name__}")
            widths.append(module.config.hidden_size)
        expected = unwrapped(self.unet).config.cross_attention_dim
        if sum(widths) != expected:
            raise ValueError(f"{self.name}: the text encoders give {' + '.join(map(str, widths))} channels, the UNet's "
                             f"cross_attention_dim is {expected}")

    # ----- facts ---------------------------------------------------------------------------
    @property
    def vae_scale_factor(self) -> int:
        """How much smaller the latents are than the images (8 for every SD VAE)."""
        return 2 ** (len(unwrapped(self.vae).config.block_out_channels) - 1)

    @property
    def latent_channels(self) -> int:
        return int(unwrapped(self.unet).config.in_channels)

    @property
    def interrupt(self) -> bool:
        """Set ``pipe._interrupt = True`` in a ``callback_on_step_end`` to stop the loop, as in diffusers."""
        return self._interrupt

    @property
    def text_width(self) -> int:
        """The channels of the text states the UNet attends to."""
        return int(unwrapped(self.unet).config.cross_attention_dim)

    def _facts(self) -> ModelFacts:
        return replace(super()._facts(), size_multiple=1)  # the UNet takes any latent size

    # ----- the call ------------------------------------------------------------------------
    def __call__(self, prompt: str | list[str] | None = None, height: int | None = None, width: int | None = None,
                 num_inference_steps: int = 50, guidance_scale: float = 7.5,
                 negative_prompt: str | list[str] | None = None, num_images_per_prompt: int = 1, eta: float = 0.0,
                 generator: tc.Generator | None = None, latents: Tensor | None = None,
                 prompt_embeds: Tensor | None = None, negative_prompt_embeds: Tensor | None = None,
                 output_type: str = "pil", return_dict: bool = True,
                 cross_attention_kwargs: dict[str, Any] | None = None, guidance_rescale: float = 0.0,
                 clip_skip: int | None = None, callback_on_step_end: StepCallback | None = None,
                 callback_on_step_end_tensor_inputs: Sequence[str] = ("latents",), *, seed: int | None = None,
                 progress: bool = True) -> ImagePipelineOutput | tuple:
        """Images for ``prompt`` (diffusers' arguments and defaults; ``seed`` makes a generator).

        ``height``/``width``: multiples of 8 (default: the UNet's sample size × 8).
        ``output_type``: "pil", "np" (float32 [B, H, W, 3] in [0, 1]), "tensor"/"pt" ([B, 3, H, W]
        on the device) or "latent" (the final latents, not decoded).  ``clip_skip``: encode with
        the hidden state that many layers before the last.  ``cross_attention_kwargs={"scale": s}``:
        the LoRA scale of this call.  ``return_dict=False`` returns ``(images, None)`` as diffusers
        does (no safety checker).  Every argument is checked before any work starts.
        """
        return self._finish(run_sync(self._text_generation(locals())), return_dict)

    async def generate_async(self, *args: Any, **kwargs: Any) -> ImagePipelineOutput | tuple:
        """``pipe(...)`` with the same arguments under asyncio, bit-identical to it; cancelling the
        task stops it at the next step."""
        values = inspect.signature(self.__call__).bind(*args, **kwargs)
        values.apply_defaults()
        generation = self._text_generation(dict(values.arguments))
        return self._finish(await run_async(generation), values.arguments["return_dict"])

    def generate(self, *args: Any, **kwargs: Any) -> ImagePipelineOutput | tuple:
        """``pipe(...)`` by name, with the same arguments (each pipeline's own ``__call__``)."""
        return self(*args, **kwargs)

    def _text_generation(self, values: dict[str, Any]) -> TextGeneration:
        """The generation of a call whose arguments are ``values`` (checked first)."""
        return TextGeneration(self, self._request(**self._call_arguments(values)))

    def _call_arguments(self, values: dict[str, Any]) -> dict[str, Any]:
        """A call's arguments as the checks take them (``self`` and ``return_dict`` are not)."""
        return {k: v for k, v in values.items() if k not in ("self", "return_dict", "__class__")}

    def _request(self, **arguments: Any) -> TextRequest:
        """The checked call: the arguments every SD pipeline shares, then this class's own
        (``_own_arguments`` names them, ``_checked_own`` checks them into the request)."""
        own = {k: arguments.pop(k) for k in self._own_arguments}
        config = unwrapped(self.unet).config
        request = check_text_request(self._facts(), **arguments, lcm=config.time_cond_proj_dim is not None,
                                     embed_width=self.text_width, vae_scale_factor=self.vae_scale_factor,
                                     max_clip_skip=self._max_clip_skip())
        self._checked_own(request, **own)
        self._interrupt = False
        return request

    _own_arguments: tuple[str, ...] = ()

    def _checked_own(self, request: TextRequest, **own: Any) -> None:
        """Check this class's own call arguments into ``request`` (none here)."""

    def _max_clip_skip(self) -> int:
        return min(int(unwrapped(e).config.num_hidden_layers) for e, _ in self.text_pairs()) - 1

    @staticmethod
    def _finish(output: ImagePipelineOutput, return_dict: bool) -> ImagePipelineOutput | tuple:
        return output if return_dict else (output.images, None)

    # ----- what the generation asks of the pipeline ---------------------------------------
    def prompt_states(self, r: TextRequest) -> PromptStates:
        return encode_prompt(self.text_stage, unwrapped(self.text_encoder), self.tokenizer, r.prompts,
                             r.negative_prompts, r.prompt_embeds, r.negative_prompt_embeds, r.guided, r.clip_skip,
                             r.num_images_per_prompt, self.dtype, self.device, self.name)

    def unet_conditioning(self, r: TextRequest) -> dict[str, Any]:
        """The UNet's keyword arguments for the call: the text states ([uncond, cond] when
        guiding), LCM's guidance embedding, SDXL's added conditions."""
        states = self.prompt_states(r)
        hidden = tc.cat([states.negative, states.embeds]) if r.guided else states.embeds
        conditioning: dict[str, Any] = {"encoder_hidden_states": hidden}
        if self.hoist_text_states:
            conditioning["cross_attention_kv"] = unwrapped(self.unet).cross_attention_kv(hidden)
        dim = unwrapped(self.unet).config.time_cond_proj_dim
        if dim is not None:
            w = tc.full((r.batch_size,), r.guidance_scale - 1.0, dtype=tc.float32, device=self.device)
            conditioning["timestep_cond"] = get_guidance_scale_embedding(w, dim).to(dtype=self.dtype)
        added = self.added_conditioning(r, states)
        if added is not None:
            conditioning["added_cond_kwargs"] = added
        return conditioning

    def added_conditioning(self, r: TextRequest, states: PromptStates) -> dict[str, Tensor] | None:
        """SDXL's ``added_cond_kwargs`` (none here)."""
        return None

    def noised_image_latents(self, r: TextRequest, run: Any) -> Tensor:
        """Image-to-image's start (``StableDiffusionImg2ImgPipeline``)."""
        raise TypeError(f"{self.name} takes no image; use StableDiffusionImg2ImgPipeline")

    # ----- folders -------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, dtype: Any = None, device: str | None = None,
                        variant: str | None = None, compile: bool | None = None,  # noqa: A002
                        scheduler: Any = None) -> "StableDiffusionPipeline":
        """The pipeline in a diffusers folder (``model_index.json`` and a folder per part).

        ``dtype`` (default float32) and ``device`` apply to every model; ``variant="fp16"``
        reads the ``*.fp16.safetensors`` weights.  ``scheduler``: a scheduler object to use
        instead of the stored one, or a scheduler class to load the stored config into (needed
        when the folder names a scheduler class this code lacks)."""
        parts, options = load_components(folder, cls.__name__, cls._parts, cls._optional, dtype, device, variant,
                                         scheduler)
        return cls._from_components(parts, options, compile)

    @classmethod
    def _from_components(cls, parts: dict[str, Any], options: dict[str, Any],
                         compile: bool | None) -> "StableDiffusionPipeline":  # noqa: A002
        return cls(parts["vae"], parts["text_encoder"], parts["tokenizer"], parts["unet"], parts["scheduler"],
                   compile=compile)

    def save_pretrained(self, folder: str | os.PathLike, variant: str | None = None) -> None:
        """Write the pipeline as a diffusers folder (diffusers' ``from_pretrained`` reads it)."""
        parts = {name: getattr(self, name) for name in self._parts + self._optional}
        absent = dict.fromkeys(self._absent)
        save_components(folder, type(self).__name__, {**parts, **absent}, self._options(), variant)

    _absent: tuple[str, ...] = ("safety_checker", "feature_extractor", "image_encoder")  # parts not run here

    def _options(self) -> dict[str, Any]:
        """The pipeline's own entries of ``model_index.json``."""
        return {"requires_safety_checker": False}

