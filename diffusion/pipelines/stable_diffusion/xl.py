"""``StableDiffusionXLPipeline``: SDXL text to image with two text encoders and size conditioning, as in diffusers.

The UNet attends to both encoders' penultimate states side by side (768 + 1280 channels
in SDXL) and adds ``text_time`` conditioning: the second encoder's projected pooled state
and the six "time ids" ``original_size + crops_coords_top_left + target_size``.  A float16
VAE whose config says ``force_upcast`` decodes in float32; a VAE with ``latents_mean`` /
``latents_std`` unscales the latents with them.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import tensorcore as tc
from tensorcore import Tensor

from ..drivers import run_sync
from ..modules import unwrapped
from ..output import ImagePipelineOutput
from .prompts import PromptStates, encode_prompt_xl
from .request import TextRequest, pooled_states, prompt_list
from .text_to_image import StableDiffusionPipeline, StepCallback

Size = tuple[int, int]


class StableDiffusionXLPipeline(StableDiffusionPipeline):
    """SDXL: ``vae``, ``text_encoder`` (may be None), ``text_encoder_2``, ``tokenizer`` (may be None),
    ``tokenizer_2``, ``unet``, ``scheduler``; ``force_zeros_for_empty_prompt`` as the folder says."""

    _parts = ("vae", "text_encoder_2", "tokenizer_2", "unet", "scheduler")
    _optional = ("text_encoder", "tokenizer")
    _own_arguments = ("prompt_2", "negative_prompt_2", "pooled_prompt_embeds", "negative_pooled_prompt_embeds",
                      "original_size", "crops_coords_top_left", "target_size", "negative_original_size",
                      "negative_crops_coords_top_left", "negative_target_size")

    def __init__(self, vae: Any, text_encoder: Any, text_encoder_2: Any, tokenizer: Any, tokenizer_2: Any,
                 unet: Any, scheduler: Any, force_zeros_for_empty_prompt: bool = True,
                 compile: bool | None = None) -> None:  # noqa: A002
        self.text_encoder_2, self.tokenizer_2 = text_encoder_2, tokenizer_2
        self.force_zeros_for_empty_prompt = bool(force_zeros_for_empty_prompt)
        super().__init__(vae, text_encoder, tokenizer, unet, scheduler, compile)

    def text_pairs(self) -> list[tuple[Any, Any]]:
        pairs = [(self.text_encoder, self.tokenizer), (self.text_encoder_2, self.tokenizer_2)]
        return [(e, t) for e, t in pairs if e is not None]

    def __call__(self, prompt: str | list[str] | None = None, prompt_2: str | list[str] | None = None,
                 height: int | None = None, width: int | None = None, num_inference_steps: int = 50,
                 guidance_scale: float = 5.0, negative_prompt: str | list[str] | None = None,
                 negative_prompt_2: str | list[str] | None = None, num_images_per_prompt: int = 1, eta: float = 0.0,
                 generator: tc.Generator | None = None, latents: Tensor | None = None,
                 prompt_embeds: Tensor | None = None, negative_prompt_embeds: Tensor | None = None,
                 pooled_prompt_embeds: Tensor | None = None, negative_pooled_prompt_embeds: Tensor | None = None,
                 output_type: str = "pil", return_dict: bool = True,
                 cross_attention_kwargs: dict[str, Any] | None = None, guidance_rescale: float = 0.0,
                 original_size: Size | None = None, crops_coords_top_left: Size = (0, 0),
                 target_size: Size | None = None, negative_original_size: Size | None = None,
                 negative_crops_coords_top_left: Size = (0, 0), negative_target_size: Size | None = None,
                 clip_skip: int | None = None, callback_on_step_end: StepCallback | None = None,
                 callback_on_step_end_tensor_inputs: Sequence[str] = ("latents",), *, seed: int | None = None,
                 progress: bool = True) -> ImagePipelineOutput | tuple:
        """Images for ``prompt`` (and ``prompt_2`` for the second encoder; default: ``prompt``).

        ``original_size`` / ``target_size`` (default: the output size) and
        ``crops_coords_top_left`` are SDXL's size conditioning; the ``negative_`` ones condition
        the unguided half (default: the same, unless both negative sizes are given).  Other
        arguments as ``StableDiffusionPipeline``; SDXL's default guidance scale is 5.
        """
        return self._finish(run_sync(self._text_generation(locals())), return_dict)

    def _checked_own(self, request: TextRequest, prompt_2: Any, negative_prompt_2: Any, pooled_prompt_embeds: Any,
                     negative_pooled_prompt_embeds: Any, original_size: Any, crops_coords_top_left: Any,
                     target_size: Any, negative_original_size: Any, negative_crops_coords_top_left: Any,
                     negative_target_size: Any) -> None:
        name, facts = self.name, self._facts()
        rows = len(request.prompts) if request.prompts is not None else request.prompt_embeds.shape[0]
        request.prompts_2 = _matched(name, "prompt_2", prompt_list(name, "prompt_2", prompt_2), rows)
        request.negative_prompts_2 = _matched(name, "negative_prompt_2",
                                              prompt_list(name, "negative_prompt_2", negative_prompt_2), rows)
        if request.prompts_2 is not None and request.prompts is None:
            raise ValueError(f"{name}: prompt_2 given with prompt_embeds; pass prompts or states, not both")
        width = self.pooled_width
        request.pooled_prompt_embeds = pooled_states(facts, "pooled_prompt_embeds", pooled_prompt_embeds, width, rows)
        request.negative_pooled_prompt_embeds = pooled_states(facts, "negative_pooled_prompt_embeds",
                                                              negative_pooled_prompt_embeds, width, rows)
        if (request.prompt_embeds is None) != (request.pooled_prompt_embeds is None):
            raise ValueError(f"{name}: prompt_embeds and pooled_prompt_embeds go together (both or neither)")
        if (request.negative_prompt_embeds is None) != (request.negative_pooled_prompt_embeds is None):
            raise ValueError(f"{name}: negative_prompt_embeds and negative_pooled_prompt_embeds go together")
        output = (request.height, request.width)
        ids = _size(name, "original_size", original_size, output) + _size(name, "crops_coords_top_left",
                                                                           crops_coords_top_left, output) \
            + _size(name, "target_size", target_size, output)
        negative = ids
        if negative_original_size is not None and negative_target_size is not None:
            negative = _size(name, "negative_original_size", negative_original_size, output) \
                + _size(name, "negative_crops_coords_top_left", negative_crops_coords_top_left, output) \
                + _size(name, "negative_target_size", negative_target_size, output)
        expected = unwrapped(self.unet).config.projection_class_embeddings_input_dim
        given = unwrapped(self.unet).config.addition_time_embed_dim * len(ids) + width
        if expected != given:
            raise ValueError(f"{name}: the UNet expects {expected} added-conditioning channels, the text encoder and "
                             f"time ids give {given}: check unet.config and text_encoder_2.config.projection_dim")
        request.time_ids = (list(ids), list(negative))

    @property
    def pooled_width(self) -> int:
        """The width of ``text_embeds``: the second encoder's projection."""
        return int(unwrapped(self.text_encoder_2).config.projection_dim)

    def prompt_states(self, r: TextRequest) -> PromptStates:
        encoders = [unwrapped(e) for e, _ in self.text_pairs()]
        tokenizers = [t for _, t in self.text_pairs()]
        prompts = negatives = None
        if r.prompts is not None:
            prompts = [r.prompts, r.prompts_2 or r.prompts][-len(encoders):]
        first = r.negative_prompts or [""] * (len(r.prompts) if r.prompts else r.prompt_embeds.shape[0])
        negatives = [first, r.negative_prompts_2 or first][-len(encoders):]
        given = None if r.prompt_embeds is None else PromptStates(r.prompt_embeds, pooled=r.pooled_prompt_embeds)
        given_negative = None if r.negative_prompt_embeds is None else \
            PromptStates(r.negative_prompt_embeds, pooled=r.negative_pooled_prompt_embeds)
        zero_negative = r.negative_prompts is None and self.force_zeros_for_empty_prompt
        return encode_prompt_xl(self.text_stage, encoders, tokenizers, prompts, negatives, given, given_negative,
                                r.guided, zero_negative, r.clip_skip, r.num_images_per_prompt, self.dtype,
                                self.device, self.name)

    def added_conditioning(self, r: TextRequest, states: PromptStates) -> dict[str, Tensor]:
        """``text_embeds`` (the pooled states) and ``time_ids``, [uncond, cond] when guiding.  The
        time ids are stacked then repeated per image, as diffusers does: [neg, pos, neg, pos, ...]."""
        ids, negative = r.time_ids
        dtype = states.embeds.dtype
        if not r.guided:
            return {"text_embeds": states.pooled,
                    "time_ids": tc.tensor([ids] * r.batch_size, device=self.device).to(dtype=dtype)}
        rows = [negative, ids] * r.batch_size
        return {"text_embeds": tc.cat([states.negative_pooled, states.pooled]),
                "time_ids": tc.tensor(rows, device=self.device).to(dtype=dtype)}

    def unscaled(self, sample: Tensor) -> Tensor:
        """Unscaled by ``latents_std`` / ``latents_mean`` when the VAE's config has them."""
        config = unwrapped(self.vae).config
        mean, std = config.get("latents_mean"), config.get("latents_std")
        if mean is None or std is None:
            return super().unscaled(sample)
        shape = (1, len(mean), 1, 1)
        mean_t = tc.tensor(mean, device=self.device).reshape(shape).to(dtype=sample.dtype)
        std_t = tc.tensor(std, device=self.device).reshape(shape).to(dtype=sample.dtype)
        return sample * std_t / config["scaling_factor"] + mean_t

    def decode(self, sample: Tensor) -> Tensor:
        """A float16 VAE whose config asks for ``force_upcast`` decodes in float32, as diffusers does."""
        vae = unwrapped(self.vae)
        if vae.dtype == tc.float16 and vae.config.get("force_upcast", False):
            return self._float32_vae().decode(self.unscaled(sample).to(dtype=tc.float32))
        return super().decode(sample)

    def _float32_vae(self) -> Any:
        """A float32 copy of the VAE's current weights (the float16 one stays as it is)."""
        vae = unwrapped(self.vae)
        copy = type(vae).from_config(vae.config).to(device=self.device)
        copy.load_state_dict({k: v.to(dtype=tc.float32) for k, v in vae.state_dict().items()})
        return copy.eval()

    @classmethod
    def _from_components(cls, parts: dict[str, Any], options: dict[str, Any],
                         compile: bool | None) -> "StableDiffusionXLPipeline":  # noqa: A002
        return cls(parts["vae"], parts["text_encoder"], parts["text_encoder_2"], parts["tokenizer"],
                   parts["tokenizer_2"], parts["unet"], parts["scheduler"],
                   options.get("force_zeros_for_empty_prompt", True), compile=compile)

    _absent = ("image_encoder", "feature_extractor")

    def _options(self) -> dict[str, Any]:
        return {"force_zeros_for_empty_prompt": self.force_zeros_for_empty_prompt}


def _matched(name: str, argument: str, texts: list[str] | None, rows: int) -> list[str] | None:
    """``texts`` as one per prompt (a single text serves every prompt)."""
    if texts is not None and len(texts) == 1:
        return texts * rows
    if texts is not None and len(texts) != rows:
        raise ValueError(f"{name}: {argument} has {len(texts)} entries, prompt has {rows}")
    return texts


def _size(name: str, argument: str, value: Any, default: Size) -> tuple[int, int]:
    """A (height, width) pair of non-negative ints (``default`` when None)."""
    value = default if value is None else value
    if not isinstance(value, (tuple, list)) or len(value) != 2 or \
            not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 0 for v in value):
        raise ValueError(f"{name}: {argument} must be a (height, width) pair of ints >= 0, got {value!r}")
    return int(value[0]), int(value[1])
