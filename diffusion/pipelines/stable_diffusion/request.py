"""Checking a Stable Diffusion call's arguments before any work starts.

Every check raises ``ValueError`` / ``TypeError`` naming the argument and the value, so a
bad call costs nothing and changes nothing.  What passes is a ``TextRequest``: the
fields the shared ``Generation`` reads (steps, generator, guidance, latents...) and the
text-to-image ones (prompts or their states, size, image-to-image start, SDXL sizes).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Sequence

from tensorcore import Tensor

from ..inputs import (ModelFacts, Request, checked_generator, checked_latents, checked_steps, finite_float,
                      positive_int, scheduler_step_kwargs)

# diffusers' output types -> what Generation.collect makes of the images ("latent" skips the decode)
OUTPUT_TYPES = {"pil": "pil", "np": "numpy", "latent": "tensor", "tensor": "tensor", "pt": "tensor"}
# the tensors a callback_on_step_end may ask for (and hand back)
CALLBACK_TENSORS = ("latents", "prompt_embeds", "negative_prompt_embeds")


@dataclass
class TextRequest(Request):
    """A checked Stable Diffusion call (``Request``'s fields, ``batch_size`` counting images)."""

    prompts: list[str] | None = None           # one per prompt (before num_images_per_prompt)
    prompts_2: list[str] | None = None          # SDXL's second encoder
    negative_prompts: list[str] | None = None
    negative_prompts_2: list[str] | None = None
    prompt_embeds: Tensor | None = None
    negative_prompt_embeds: Tensor | None = None
    pooled_prompt_embeds: Tensor | None = None
    negative_pooled_prompt_embeds: Tensor | None = None
    num_images_per_prompt: int = 1
    height: int = 0
    width: int = 0
    clip_skip: int | None = None
    lora_scale: float | None = None
    image: Tensor | None = None                 # image-to-image: [B, C, H, W] in [-1, 1], or latents
    strength: float = 1.0
    image_is_latent: bool = False
    time_ids: tuple[list[float], list[float]] | None = None  # SDXL: (conditional, negative)
    callback_tensors: tuple[str, ...] = ("latents",)
    lcm: bool = False                           # the UNet takes the guidance as an embedding
    latent_output: bool = False                 # output_type="latent": the latents, not decoded

    @property
    def guided(self) -> bool:
        """diffusers' ``do_classifier_free_guidance``: scale above 1, and a UNet that does not
        take the guidance scale as an input (LCM's ``time_cond_proj_dim``)."""
        return self.guidance_scale > 1.0 and not self.lcm


def prompt_list(name: str, argument: str, value: Any) -> list[str] | None:
    """``value`` (a string or a list of strings) as a list, or None."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise TypeError(f"{name}: {argument} must be a string or a non-empty list of strings, got {value!r}")


def check_text_request(facts: ModelFacts, *, prompt: Any, negative_prompt: Any, prompt_embeds: Any,
                       negative_prompt_embeds: Any, height: Any, width: Any, num_inference_steps: Any,
                       guidance_scale: Any, guidance_rescale: Any, num_images_per_prompt: Any, eta: Any,
                       seed: Any, generator: Any, latents: Any, output_type: Any, clip_skip: Any,
                       callback_on_step_end: Any, callback_on_step_end_tensor_inputs: Any,
                       cross_attention_kwargs: Any, progress: Any, lcm: bool, embed_width: int,
                       vae_scale_factor: int, max_clip_skip: int) -> TextRequest:
    """The checked form of a Stable Diffusion call on a pipeline described by ``facts``."""
    name = facts.name
    prompts = prompt_list(name, "prompt", prompt)
    if (prompts is None) == (prompt_embeds is None):
        raise ValueError(f"{name}: pass exactly one of prompt and prompt_embeds")
    negatives = prompt_list(name, "negative_prompt", negative_prompt)
    if negatives is not None and negative_prompt_embeds is not None:
        raise ValueError(f"{name}: pass negative_prompt or negative_prompt_embeds, not both")
    embeds = _states(facts, "prompt_embeds", prompt_embeds, 3, embed_width)
    negative_embeds = _states(facts, "negative_prompt_embeds", negative_prompt_embeds, 3, embed_width)
    count = len(prompts) if prompts is not None else embeds.shape[0]
    if negatives is not None and len(negatives) == 1 and count > 1:
        negatives = negatives * count
    if negatives is not None and len(negatives) != count:
        raise ValueError(f"{name}: negative_prompt has {len(negatives)} entries, prompt has {count}")
    if negative_embeds is not None and embeds is not None and negative_embeds.shape != embeds.shape:
        raise ValueError(f"{name}: negative_prompt_embeds {negative_embeds.shape} must match prompt_embeds "
                         f"{embeds.shape}")
    if negative_embeds is not None and negative_embeds.shape[0] != count:
        raise ValueError(f"{name}: negative_prompt_embeds has {negative_embeds.shape[0]} rows, prompt has {count}")
    per_prompt = positive_int(name, "num_images_per_prompt", num_images_per_prompt)
    batch = count * per_prompt
    size = _size(name, height, width, facts, vae_scale_factor)
    steps = checked_steps(facts, num_inference_steps)
    gen = checked_generator(name, seed, generator, facts.device)
    scale = finite_float(name, "guidance_scale", guidance_scale)
    rescale = finite_float(name, "guidance_rescale", guidance_rescale, 0.0, 1.0)
    if clip_skip is not None and (not isinstance(clip_skip, numbers.Integral) or isinstance(clip_skip, bool)
                                  or not 0 <= clip_skip <= max_clip_skip):
        raise ValueError(f"{name}: clip_skip must be None or an int in [0, {max_clip_skip}] (the text encoder's "
                         f"layers to skip), got {clip_skip!r}")
    if not isinstance(output_type, str) or output_type not in OUTPUT_TYPES:
        raise ValueError(f"{name}: output_type must be one of {list(OUTPUT_TYPES)}, got {output_type!r}")
    if callback_on_step_end is not None and not callable(callback_on_step_end):
        raise TypeError(f"{name}: callback_on_step_end must be callable(pipe, step, timestep, tensors) -> dict, "
                        f"got {type(callback_on_step_end).__name__}")
    tensor_inputs = tuple(callback_on_step_end_tensor_inputs or ())
    unknown = [k for k in tensor_inputs if k not in CALLBACK_TENSORS]
    if unknown:
        raise ValueError(f"{name}: callback_on_step_end_tensor_inputs {unknown} are not among {list(CALLBACK_TENSORS)}")
    lora_scale = _lora_scale(name, cross_attention_kwargs)
    expected_latents = (batch, facts.latent_channels, size[0] // vae_scale_factor, size[1] // vae_scale_factor)
    checked = checked_latents(facts, latents, batch)
    if checked is not None and tuple(checked.shape) != expected_latents:
        raise ValueError(f"{name}: latents must have shape {list(expected_latents)} for {size[0]}x{size[1]} images, "
                         f"got {checked.shape}")
    return TextRequest(
        batch_size=batch, num_inference_steps=steps, generator=gen, owns_generator=seed is not None,
        step_kwargs=scheduler_step_kwargs(facts, gen, eta), guidance_scale=scale, class_labels=None, context=None,
        negative_context=None, latents=checked, output=OUTPUT_TYPES[output_type], progress=bool(progress),
        callback=callback_on_step_end, guidance_rescale=rescale, prompts=prompts, negative_prompts=negatives,
        prompt_embeds=embeds, negative_prompt_embeds=negative_embeds, num_images_per_prompt=per_prompt,
        height=size[0], width=size[1], clip_skip=None if clip_skip is None else int(clip_skip),
        lora_scale=lora_scale, callback_tensors=tensor_inputs, lcm=lcm, latent_output=output_type == "latent")


def _states(facts: ModelFacts, argument: str, value: Any, ndim: int, width: int) -> Tensor | None:
    """Given text states: a Tensor of ``ndim`` dims, ``width`` channels last, on the model's device."""
    if value is None:
        return None
    if not isinstance(value, Tensor):
        raise TypeError(f"{facts.name}: {argument} must be a Tensor, got {type(value).__name__}")
    if value.ndim != ndim or value.shape[-1] != width:
        shape = "[B, L, " if ndim == 3 else "[B, "
        raise ValueError(f"{facts.name}: {argument} must be {shape}{width}], got {value.shape}")
    if value.device != facts.device:
        raise ValueError(f"{facts.name}: {argument} is on {value.device}, the model on {facts.device}")
    return value


def pooled_states(facts: ModelFacts, argument: str, value: Any, width: int, rows: int | None) -> Tensor | None:
    """SDXL's given pooled states [rows, width]."""
    checked = _states(facts, argument, value, 2, width)
    if checked is not None and rows is not None and checked.shape[0] != rows:
        raise ValueError(f"{facts.name}: {argument} has {checked.shape[0]} rows, the prompts {rows}")
    return checked


def _size(name: str, height: Any, width: Any, facts: ModelFacts, scale: int) -> tuple[int, int]:
    """(height, width) in pixels: given, or the UNet's sample size times the VAE's ``scale``
    (any multiple of the VAE's scale works: the UNet resizes where halving leaves an odd size)."""
    default = facts.latent_shape
    sizes = []
    for argument, value, index in (("height", height, 1), ("width", width, 2)):
        if value is None:
            if default is None:
                raise ValueError(f"{name}: the UNet's config has no sample_size: pass {argument}")
            value = default[index] * scale
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < scale or value % scale:
            raise ValueError(f"{name}: {argument} must be a positive multiple of {scale} (the VAE's "
                             f"downsampling), got {value!r}")
        sizes.append(int(value))
    return sizes[0], sizes[1]


def _lora_scale(name: str, cross_attention_kwargs: Any) -> float | None:
    """The LoRA scale of ``cross_attention_kwargs={"scale": s}`` (the only key read here)."""
    if cross_attention_kwargs is None:
        return None
    if not isinstance(cross_attention_kwargs, dict):
        raise TypeError(f"{name}: cross_attention_kwargs must be a dict, got {type(cross_attention_kwargs).__name__}")
    unknown = sorted(set(cross_attention_kwargs) - {"scale"})
    if unknown:
        raise ValueError(f"{name}: cross_attention_kwargs {unknown} are not supported (only 'scale', the LoRA scale)")
    if "scale" not in cross_attention_kwargs:
        return None
    return finite_float(name, "cross_attention_kwargs['scale']", cross_attention_kwargs["scale"], -1e6, 1e6)
