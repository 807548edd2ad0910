"""CLIP's text encoder as transformers' ``CLIPTextModel`` and ``CLIPTextModelWithProjection``.

Config keys, defaults, parameter names (``text_model.embeddings.token_embedding.weight``,
``text_model.encoder.layers.N.self_attn.q_proj.weight``, ``text_projection.weight``, ...)
and outputs are transformers', so a Stable Diffusion ``text_encoder`` folder loads as it
is and code written for transformers reads ``out.last_hidden_state``,
``out.hidden_states[-2]`` (``clip_skip``, SDXL) or ``out[0]`` unchanged.

    encoder = CLIPTextModel.from_pretrained("sd-1.5/text_encoder")
    states = encoder(tokenizer(prompt, padding="max_length", return_tensors="np").input_ids).last_hidden_state
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np

import tensorcore as tc
from layers import LayerNorm, Linear, Module, init
from tensorcore import Tensor

from .bounds import MAX_WIDTH, count, name, number, optional, width
from .clip_layers import HIDDEN_ACTS, CLIPAttention, CLIPEncoder, CLIPMLP, CLIPTextEmbeddings, attention_mask
from .config import register_to_config
from .transformers_pretrained import TransformersPretrained
from .weights import Found

PREFIX = "text_model."
TOKEN_ID = count(0, MAX_WIDTH)


class _ModelOutput:
    """Fields by name (``out.last_hidden_state``, ``out["last_hidden_state"]``) or by position
    over the fields that are set (``out[0]``), as transformers' ``ModelOutput``."""

    def to_tuple(self) -> tuple[Any, ...]:
        values = (getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]
        return tuple(v for v in values if v is not None)

    def __getitem__(self, key: int | slice | str) -> Any:
        return getattr(self, key) if isinstance(key, str) else self.to_tuple()[key]


@dataclass
class BaseModelOutputWithPooling(_ModelOutput):
    """``last_hidden_state`` [B, L, hidden] (after the final LayerNorm), ``pooler_output`` [B, hidden]
    (the state at each sequence's EOS token) and, when asked for, ``hidden_states``: the
    embeddings, then every layer's output (``num_hidden_layers + 1`` tensors, before the final LayerNorm)."""

    last_hidden_state: Tensor
    pooler_output: Tensor
    hidden_states: tuple[Tensor, ...] | None = None


@dataclass
class CLIPTextModelOutput(_ModelOutput):
    """``text_embeds`` [B, projection_dim] (the projected pooled state), ``last_hidden_state`` and ``hidden_states``."""

    text_embeds: Tensor
    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None


class CLIPTextTransformer(Module):
    """Embeddings, the encoder and ``final_layer_norm``; pools at the EOS token."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.eos_token_id = config.eos_token_id
        self.embeddings = CLIPTextEmbeddings(config.vocab_size, config.hidden_size, config.max_position_embeddings)
        self.encoder = CLIPEncoder(config.num_hidden_layers, config.hidden_size, config.intermediate_size,
                                   config.num_attention_heads, config.hidden_act, config.layer_norm_eps)
        self.final_layer_norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: Tensor, attention_mask_: Tensor | None, output_hidden_states: bool
                ) -> BaseModelOutputWithPooling:
        hidden = self.embeddings(input_ids)
        mask = None if attention_mask_ is None else attention_mask(attention_mask_, hidden.dtype)
        states = self.encoder(hidden, mask)
        last = self.final_layer_norm(states[-1])
        return BaseModelOutputWithPooling(last, last[tc.arange(last.shape[0], device=last.device),
                                                      self.eos_positions(input_ids)],
                                          tuple(states) if output_hidden_states else None)

    def eos_positions(self, input_ids: Tensor) -> Tensor:
        """Each sequence's first EOS token; with ``eos_token_id == 2`` (configs written before
        transformers fixed CLIP's ids, as Stable Diffusion's) its largest id, as transformers keeps it."""
        if self.eos_token_id == 2:
            return input_ids.argmax(axis=-1)
        return (input_ids == self.eos_token_id).int().argmax(axis=-1)


class CLIPTextPretrained(TransformersPretrained):
    """What the two CLIP text models share: the config, the weights' layout, the checks on inputs."""

    model_type = "clip_text_model"
    retired_keys = frozenset({"dropout", "gradient_checkpointing"})
    has_projection = False

    config_bounds = {
        "vocab_size": width(), "hidden_size": width(), "intermediate_size": width(), "projection_dim": width(),
        "num_hidden_layers": count(), "num_attention_heads": width(), "max_position_embeddings": width(),
        "hidden_act": name(), "layer_norm_eps": number(), "attention_dropout": number(),
        "initializer_range": number(), "initializer_factor": number(),
        "pad_token_id": optional(TOKEN_ID), "bos_token_id": optional(TOKEN_ID), "eos_token_id": TOKEN_ID,
    }

    @staticmethod
    def parameter_shares(config: Mapping[str, Any]) -> dict[tuple[str, ...], int]:
        """The embedding tables and the layers' projections (the projection head is left out)."""
        hidden = config["hidden_size"]
        return {("vocab_size", "hidden_size"): config["vocab_size"] * hidden,
                ("max_position_embeddings", "hidden_size"): config["max_position_embeddings"] * hidden,
                ("num_hidden_layers", "hidden_size", "intermediate_size"):
                    config["num_hidden_layers"] * (4 * hidden + 2 * config["intermediate_size"]) * hidden}

    @register_to_config
    def __init__(self, vocab_size: int = 49408, hidden_size: int = 512, intermediate_size: int = 2048,
                 projection_dim: int = 512, num_hidden_layers: int = 12, num_attention_heads: int = 8,
                 max_position_embeddings: int = 77, hidden_act: str = "quick_gelu", layer_norm_eps: float = 1e-5,
                 attention_dropout: float = 0.0, initializer_range: float = 0.02, initializer_factor: float = 1.0,
                 pad_token_id: int | None = 1, bos_token_id: int | None = 49406, eos_token_id: int = 49407) -> None:
        super().__init__()
        _check_config(type(self).__name__, locals())
        config = _Namespace(locals())
        self.text_model = CLIPTextTransformer(config)
        if self.has_projection:
            self.text_projection = Linear(hidden_size, projection_dim, bias=False)
        self._init_weights(initializer_factor, num_hidden_layers, hidden_size)

    def _init_weights(self, factor: float, num_layers: int, hidden: int) -> None:
        """transformers' initialisation of a CLIP text model (normal weights, zero biases)."""
        depth = (2 * num_layers) ** -0.5
        for module in self.modules():
            if isinstance(module, CLIPTextEmbeddings):
                init.normal_(module.token_embedding.weight, std=0.02 * factor)
                init.normal_(module.position_embedding.weight, std=0.02 * factor)
            elif isinstance(module, CLIPAttention):
                for proj in (module.q_proj, module.k_proj, module.v_proj):
                    init.normal_(proj.weight, std=hidden ** -0.5 * depth * factor)
                init.normal_(module.out_proj.weight, std=hidden ** -0.5 * factor)
            elif isinstance(module, CLIPMLP):
                init.normal_(module.fc1.weight, std=(2 * hidden) ** -0.5 * factor)
                init.normal_(module.fc2.weight, std=hidden ** -0.5 * depth * factor)
            if isinstance(module, Linear) and module.bias is not None:
                init.zeros_(module.bias)
        if self.has_projection:
            init.normal_(self.text_projection.weight, std=hidden ** -0.5 * factor)

    def checkpoint_weights(self, found: Found) -> Found:
        """Keys under ``text_model.`` (transformers 5 saves a ``CLIPTextModel`` without the prefix);
        the ``position_ids`` buffer older checkpoints carry is dropped."""
        named = {}
        for key, value in found.items():
            if not key.startswith(PREFIX) and key != "text_projection.weight":
                key = PREFIX + key
            if key != PREFIX + "embeddings.position_ids":
                named[key] = value
        return named

    def _encode(self, input_ids: Any, attention_mask: Any, output_hidden_states: bool) -> BaseModelOutputWithPooling:
        owner, device = type(self).__name__, self.text_model.final_layer_norm.weight.device
        ids = _as_ids(input_ids, device, "input_ids", owner)
        limit = self.config.max_position_embeddings
        if ids.ndim != 2 or not 1 <= ids.shape[1] <= limit:
            raise ValueError(f"{owner}: input_ids must be [batch, length] with 1 <= length <= "
                             f"max_position_embeddings={limit}, got shape {ids.shape}")
        mask = None if attention_mask is None else _as_ids(attention_mask, device, "attention_mask", owner)
        if mask is not None and mask.shape != ids.shape:
            raise ValueError(f"{owner}: attention_mask must match input_ids' shape {ids.shape}, got {mask.shape}")
        return self.text_model(ids, mask, output_hidden_states)


class CLIPTextModel(CLIPTextPretrained):
    """``model(input_ids, attention_mask=None, output_hidden_states=False)`` -> ``BaseModelOutputWithPooling``.

    ``input_ids`` [B, L] (a Tensor, NumPy array or nested list of ints); ``attention_mask``
    [B, L] marks real tokens with 1 and padding with 0 (padding keys are hidden from every query).
    """

    def forward(self, input_ids: Any, attention_mask: Any = None,
                output_hidden_states: bool = False) -> BaseModelOutputWithPooling:
        return self._encode(input_ids, attention_mask, output_hidden_states)


class CLIPTextModelWithProjection(CLIPTextPretrained):
    """``model(input_ids, attention_mask=None, output_hidden_states=False)`` -> ``CLIPTextModelOutput``:
    the pooled state projected by ``text_projection`` (no bias) as ``text_embeds``."""

    has_projection = True

    def forward(self, input_ids: Any, attention_mask: Any = None,
                output_hidden_states: bool = False) -> CLIPTextModelOutput:
        out = self._encode(input_ids, attention_mask, output_hidden_states)
        return CLIPTextModelOutput(self.text_projection(out.pooler_output), out.last_hidden_state, out.hidden_states)


class _Namespace:
    """Attribute access to the constructor's arguments."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update({k: v for k, v in values.items() if k not in ("self", "__class__")})


def _as_ids(value: Any, device: str, what: str, owner: str) -> Tensor:
    """An integer Tensor on ``device`` from a Tensor, NumPy array or nested list; floats raise TypeError."""
    if not isinstance(value, Tensor):
        value = tc.from_numpy(np.asarray(value))
    if value.dtype.kind not in "iub":
        raise TypeError(f"{owner}: {what} must hold integers, got {value.dtype}")
    return value.to(device, dtype=tc.int64) if value.device != device or value.dtype != tc.int64 else value


def _check_config(owner: str, values: dict[str, Any]) -> None:
    """ValueError for what the config bounds cannot say: heads that do not divide the width, an
    activation other than CLIP's, attention dropout (attention runs without it here)."""
    if values["hidden_size"] % values["num_attention_heads"]:
        raise ValueError(f"{owner}: hidden_size={values['hidden_size']} is not a multiple of "
                         f"num_attention_heads={values['num_attention_heads']}")
    if values["hidden_act"] not in HIDDEN_ACTS:
        raise ValueError(f"{owner}: config key 'hidden_act' must be one of {sorted(HIDDEN_ACTS)}, "
                         f"got {values['hidden_act']!r}")
    if values["attention_dropout"] != 0:
        raise ValueError(f"{owner}: config key 'attention_dropout' must be 0.0 (attention runs without dropout "
                         f"here), got {values['attention_dropout']!r}")
