"""Prompts to text-encoder states, as diffusers' Stable Diffusion pipelines encode them.

SD-1.x/2.x (``encode_prompt``): each prompt is tokenized to the tokenizer's
``model_max_length`` (77) and encoded; the states are the encoder's last hidden state or,
with ``clip_skip`` = k, the hidden state k layers before the last passed through the final
LayerNorm.  The negative prompts ("" by default) are encoded the same way, without
``clip_skip``.  SDXL (``encode_prompt_xl``): both encoders' penultimate hidden states (k
layers earlier with ``clip_skip``, no LayerNorm) are concatenated along the channels, and
the second encoder's projected pooled state is the ``text_embeds`` of the added
conditioning; an absent negative prompt gives zeros when the folder says
``force_zeros_for_empty_prompt``.  Each prompt's states are repeated
``num_images_per_prompt`` times in a row ([p0, p0, p1, p1]), as diffusers repeats them.

``encode_text`` is the encoder call itself (tensors in, tensors out), the pipeline's
text stage: compiled, it is one plan per prompt batch shape.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import tensorcore as tc
from tensorcore import Tensor


@dataclass
class PromptStates:
    """The UNet's text conditioning for one call, already repeated per image.

    ``embeds`` [B, L, D]; ``negative`` the same shape when guiding (else None); SDXL adds
    ``pooled`` [B, P] and ``negative_pooled``."""

    embeds: Tensor
    negative: Tensor | None = None
    pooled: Tensor | None = None
    negative_pooled: Tensor | None = None


def encode_text(text_encoder: Any, input_ids: Tensor, attention_mask: Tensor | None, hidden_layer: int | None,
                final_norm: bool) -> tuple[Tensor, Tensor]:
    """(states, pooled) of ``text_encoder`` on ``input_ids`` [B, L].

    ``hidden_layer`` None: the last hidden state; else ``hidden_states[hidden_layer]`` (a
    negative index), through the final LayerNorm when ``final_norm``.  ``pooled`` is the
    projected ``text_embeds`` of an encoder with a projection, else its ``pooler_output``.
    """
    out = text_encoder(input_ids, attention_mask=attention_mask, output_hidden_states=hidden_layer is not None)
    states = out.last_hidden_state
    if hidden_layer is not None:
        states = out.hidden_states[hidden_layer]
        if final_norm:
            states = text_encoder.text_model.final_layer_norm(states)
    pooled = out.text_embeds if hasattr(out, "text_embeds") else out.pooler_output
    return states, pooled


Encoder = Callable[..., tuple[Tensor, Tensor]]  # encode_text, compiled or not


def tokenize(tokenizer: Any, texts: Sequence[str], max_length: int, device: str, owner: str
             ) -> tuple[Tensor, Tensor]:
    """(token ids, padding mask), both [len(texts), max_length] on ``device``: padded and
    truncated to ``max_length`` (a warning names what truncation cut, as diffusers logs it)."""
    encoded = tokenizer(list(texts), padding="max_length", max_length=max_length, truncation=True,
                        return_tensors="np")
    for text in texts:
        length = len(tokenizer.encode(text)) + 2
        if length > max_length:
            warnings.warn(f"{owner}: the prompt {text!r} has {length} tokens; CLIP reads {max_length}, "
                          f"the rest was cut", UserWarning, stacklevel=5)
    return tc.tensor(encoded.input_ids, device=device), tc.tensor(encoded.attention_mask, device=device)


def _masked(text_encoder: Any, tokenizer: Any, texts: Sequence[str], max_length: int, device: str,
            owner: str) -> tuple[Tensor, Tensor | None]:
    """(ids, the padding mask when the encoder's config asks for one)."""
    ids, mask = tokenize(tokenizer, texts, max_length, device, owner)
    return ids, mask if getattr(text_encoder.config, "use_attention_mask", False) else None


def repeat_rows(x: Tensor, times: int) -> Tensor:
    """Each row of ``x`` repeated ``times`` times in a row: [a, b] -> [a, a, b, b]."""
    if times == 1:
        return x
    return x.unsqueeze(1).expand(x.shape[0], times, *x.shape[1:]).reshape(x.shape[0] * times, *x.shape[1:])


def encode_prompt(encode: Encoder, text_encoder: Any, tokenizer: Any, prompts: list[str] | None,
                  negative_prompts: list[str] | None, embeds: Tensor | None, negative_embeds: Tensor | None,
                  guided: bool, clip_skip: int | None, num_images: int, dtype: Any, device: str,
                  owner: str) -> PromptStates:
    """SD-1.x/2.x's text conditioning (see the module docstring).  ``prompts`` or ``embeds``
    is given (checked by the caller); ``negative_prompts`` None means "" for each prompt."""
    if embeds is None:
        ids, mask = _masked(text_encoder, tokenizer, prompts, tokenizer.model_max_length, device, owner)
        layer = None if clip_skip is None else -(clip_skip + 1)
        embeds = encode(text_encoder, ids, mask, layer, clip_skip is not None)[0]
    negative = None
    if guided:
        if negative_embeds is None:
            texts = negative_prompts if negative_prompts is not None else [""] * embeds.shape[0]
            ids, mask = _masked(text_encoder, tokenizer, texts, embeds.shape[1], device, owner)
            negative_embeds = encode(text_encoder, ids, mask, None, False)[0]
        negative = repeat_rows(negative_embeds.to(dtype=dtype), num_images)
    return PromptStates(repeat_rows(embeds.to(dtype=dtype), num_images), negative)


def encode_prompt_xl(encode: Encoder, text_encoders: list[Any], tokenizers: list[Any],
                     prompts: list[list[str]] | None, negative_prompts: list[list[str]] | None,
                     given: PromptStates | None, given_negative: PromptStates | None, guided: bool,
                     zero_negative: bool, clip_skip: int | None, num_images: int, dtype: Any, device: str,
                     owner: str) -> PromptStates:
    """SDXL's text conditioning (see the module docstring).  ``prompts`` holds one list of
    texts per encoder (``prompt`` and ``prompt_2``), or ``given`` holds the states (with
    ``pooled``); the negatives likewise."""
    layer = -2 if clip_skip is None else -(clip_skip + 2)
    if given is None:
        given = _encode_pair(encode, text_encoders, tokenizers, prompts, layer, None, device, owner)
    negative = given_negative
    if guided and negative is None:
        if zero_negative:
            negative = PromptStates(tc.zeros_like(given.embeds), pooled=tc.zeros_like(given.pooled))
        else:
            negative = _encode_pair(encode, text_encoders, tokenizers, negative_prompts, -2, given.embeds.shape[1],
                                    device, owner)
    states = PromptStates(repeat_rows(given.embeds.to(dtype=dtype), num_images),
                          pooled=repeat_rows(given.pooled, num_images))
    if guided:
        states.negative = repeat_rows(negative.embeds.to(dtype=dtype), num_images)
        states.negative_pooled = repeat_rows(negative.pooled, num_images)
    return states


def _encode_pair(encode: Encoder, text_encoders: list[Any], tokenizers: list[Any], prompts: list[list[str]],
                 layer: int, max_length: int | None, device: str, owner: str) -> PromptStates:
    """Every encoder's hidden state at ``layer``, concatenated; the pooled state of the first
    encoder that projects its pooled output (the second, in SDXL)."""
    states, pooled = [], None
    for text_encoder, tokenizer, texts in zip(text_encoders, tokenizers, prompts):
        ids = tokenize(tokenizer, texts, max_length or tokenizer.model_max_length, device, owner)[0]
        hidden, pooled_here = encode(text_encoder, ids, None, layer, False)
        states.append(hidden)
        if pooled is None and getattr(text_encoder, "has_projection", False):
            pooled = pooled_here
    return PromptStates(tc.cat(states, axis=-1), pooled=pooled)
