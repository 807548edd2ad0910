"""UNet2DConditionModel: Stable Diffusion's text-conditioned noise predictor (SD-1.x, SD-2.x, SDXL, LCM).

Configured, named and computed as diffusers' ``UNet2DConditionModel``, so a diffusers
``unet`` folder loads as it is.  Levels of ``CrossAttnDownBlock2D`` / ``DownBlock2D``
(ResnetBlock2Ds, each followed by a Transformer2DModel in the cross-attention blocks),
a ``UNetMidBlock2DCrossAttn``, and the mirrored up blocks; the timestep embedding may be
joined by class labels, SDXL's ``text_time`` added conditions and LCM's ``timestep_cond``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

import tensorcore as tc
from layers import Conv2d, Embedding, GroupNorm, Identity, Linear, Module, ModuleList
from tensorcore import Tensor

from .activations import activation, group_norm_act
from .attention import Attention, TextStates
from .blocks import DownBlock2D, ResnetSpec, TransformerSpec, UNetMidBlock2D, UpBlock2D, unet_path
from .config import register_to_config
from .embeddings import GaussianFourierProjection, TimestepEmbedding, Timesteps
from .pretrained import PretrainedModel
from .unet_2d import batch_timesteps
from .unet_2d_condition_config import (CONFIG_BOUNDS, DOWN_BLOCK_TYPES, OWNER, UP_BLOCK_TYPES, Depth, Level,
                                       check_config, levels, parameter_shares, up_depths)


class UNet2DConditionModel(PretrainedModel):
    """``unet(sample, timestep, encoder_hidden_states, ...)`` -> the prediction, shaped like ``sample``.

    ``sample`` is [B, in_channels, H, W] (any H and W: where halving leaves an odd size,
    the up path resizes to the skip's size, as diffusers' ``upsample_size`` does);
    ``timestep`` a number, a 0-d tensor or one value per batch element;
    ``encoder_hidden_states`` [B, L, cross_attention_dim] (the text encoder's states).
    ``num_attention_heads`` left None reads ``attention_head_dim`` as the head count, as
    diffusers does for every SD checkpoint.  Keys that only shape block types this class
    does not build (``resnet_skip_time_act``, ``resnet_out_scale_factor``,
    ``cross_attention_norm``, ``mid_block_only_cross_attention``,
    ``addition_embed_type_num_heads``) are accepted and, as in diffusers for these
    blocks, change nothing.
    """

    diffusers_class = "UNet2DConditionModel"
    config_bounds = CONFIG_BOUNDS
    parameter_shares = staticmethod(parameter_shares)

    @register_to_config
    def __init__(self, sample_size: int | Sequence[int] | None = None, in_channels: int = 4, out_channels: int = 4,
                 center_input_sample: bool = False, flip_sin_to_cos: bool = True, freq_shift: float = 0,
                 down_block_types: Sequence[str] = ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                                    "CrossAttnDownBlock2D", "DownBlock2D"),
                 mid_block_type: str | None = "UNetMidBlock2DCrossAttn",
                 up_block_types: Sequence[str] = ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                                                  "CrossAttnUpBlock2D"),
                 only_cross_attention: bool | Sequence[bool] = False,
                 block_out_channels: Sequence[int] = (320, 640, 1280, 1280),
                 layers_per_block: int | Sequence[int] = 2, downsample_padding: int = 1,
                 mid_block_scale_factor: float = 1, dropout: float = 0.0, act_fn: str = "silu",
                 norm_num_groups: int = 32, norm_eps: float = 1e-5,
                 cross_attention_dim: int | Sequence[int] = 1280,
                 transformer_layers_per_block: int | Sequence[int] | Sequence[Sequence[int]] = 1,
                 reverse_transformer_layers_per_block: Sequence[Sequence[int]] | None = None,
                 encoder_hid_dim: int | None = None, encoder_hid_dim_type: str | None = None,
                 attention_head_dim: int | Sequence[int] = 8, num_attention_heads: int | Sequence[int] | None = None,
                 dual_cross_attention: bool = False, use_linear_projection: bool = False,
                 class_embed_type: str | None = None, addition_embed_type: str | None = None,
                 addition_time_embed_dim: int | None = None, num_class_embeds: int | None = None,
                 upcast_attention: bool = False, resnet_time_scale_shift: str = "default",
                 resnet_skip_time_act: bool = False, resnet_out_scale_factor: float = 1.0,
                 time_embedding_type: str = "positional", time_embedding_dim: int | None = None,
                 time_embedding_act_fn: str | None = None, timestep_post_act: str | None = None,
                 time_cond_proj_dim: int | None = None, conv_in_kernel: int = 3, conv_out_kernel: int = 3,
                 projection_class_embeddings_input_dim: int | None = None, attention_type: str = "default",
                 class_embeddings_concat: bool = False, mid_block_only_cross_attention: bool | None = None,
                 cross_attention_norm: str | None = None, addition_embed_type_num_heads: int = 64) -> None:
        super().__init__()
        config = {k: v for k, v in locals().items() if k not in ("self", "__class__")}  # the arguments, by name
        check_config(config)
        down = levels(config)
        n = len(down)
        channels = [level.channels for level in down]
        self.conv_in = Conv2d(in_channels, channels[0], conv_in_kernel, padding=(conv_in_kernel - 1) // 2)
        time_embed_dim = self._build_time_embedding(config)
        self.class_embedding = _class_embedding(config, time_embed_dim, self.timestep_input_dim)
        if addition_embed_type == "text_time":
            self.add_time_proj = Timesteps(addition_time_embed_dim, flip_sin_to_cos, freq_shift)
            self.add_embedding = TimestepEmbedding(projection_class_embeddings_input_dim, time_embed_dim)
        else:
            self.add_time_proj = self.add_embedding = None

        block_temb = 2 * time_embed_dim if class_embeddings_concat else time_embed_dim
        resnet = ResnetSpec(block_temb, norm_num_groups, norm_eps, act_fn, resnet_time_scale_shift, dropout)

        def transformer(level: Level, depth: Depth | None = None, only_cross: bool | None = None) -> TransformerSpec:
            context_dims.add(level.cross_attention_dim)
            return TransformerSpec(level.heads, level.cross_attention_dim, norm_num_groups,
                                   level.depth if depth is None else depth, use_linear_projection,
                                   level.only_cross_attention if only_cross is None else only_cross,
                                   upcast_attention, dropout)

        context_dims: set[int] = set()
        self.down_blocks = ModuleList()
        for i, (level, block_type) in enumerate(zip(down, down_block_types)):
            spec = transformer(level) if DOWN_BLOCK_TYPES[block_type] else None
            self.down_blocks.append(DownBlock2D(channels[max(i - 1, 0)], level.channels, level.layers, resnet, spec,
                                                add_downsample=i < n - 1, downsample_padding=downsample_padding))
        self.mid_block = None
        if mid_block_type is not None:
            cross = mid_block_type == "UNetMidBlock2DCrossAttn"
            self.mid_block = UNetMidBlock2D(channels[-1], replace(resnet, output_scale_factor=mid_block_scale_factor),
                                            transformer(down[-1], only_cross=False) if cross else None,
                                            num_layers=1 if cross else 0)
        self.up_blocks = ModuleList()
        reversed_channels = channels[::-1]
        for i, (level, depth, block_type) in enumerate(zip(down[::-1], up_depths(config, down), up_block_types)):
            skip_last = reversed_channels[min(i + 1, n - 1)]
            inputs = [(reversed_channels[max(i - 1, 0)] if j == 0 else level.channels)
                      + (skip_last if j == level.layers else level.channels) for j in range(level.layers + 1)]
            spec = transformer(level, depth) if UP_BLOCK_TYPES[block_type] else None
            self.up_blocks.append(UpBlock2D(inputs, level.channels, resnet, spec, add_upsample=i < n - 1))
        self.conv_norm_out = GroupNorm(norm_num_groups, channels[0], eps=norm_eps)
        self.conv_out = Conv2d(channels[0], out_channels, conv_out_kernel, padding=(conv_out_kernel - 1) // 2)
        self.context_dims = tuple(sorted(context_dims))  # the encoder_hidden_states widths the transformers take

    def _build_time_embedding(self, c: Mapping[str, Any]) -> int:
        """Build ``time_proj`` and ``time_embedding``; returns the embedding width."""
        first = c["block_out_channels"][0]
        if c["time_embedding_type"] == "fourier":
            time_embed_dim = c["time_embedding_dim"] or 2 * first
            self.time_proj = GaussianFourierProjection(time_embed_dim // 2, log=False, flip_sin_to_cos=c["flip_sin_to_cos"])
            self.timestep_input_dim = time_embed_dim
        else:
            time_embed_dim = c["time_embedding_dim"] or 4 * first
            self.time_proj = Timesteps(first, c["flip_sin_to_cos"], c["freq_shift"])
            self.timestep_input_dim = first
        self.time_embedding = TimestepEmbedding(self.timestep_input_dim, time_embed_dim, c["act_fn"],
                                                post_act_fn=c["timestep_post_act"], cond_proj_dim=c["time_cond_proj_dim"])
        return time_embed_dim

    def forward(self, sample: Tensor, timestep: Any, encoder_hidden_states: Tensor, class_labels: Any = None,
                added_cond_kwargs: Mapping[str, Tensor] | None = None,
                cross_attention_kwargs: Mapping[str, Any] | None = None, timestep_cond: Tensor | None = None,
                cross_attention_kv: Sequence[tuple[Tensor, Tensor]] | None = None) -> Tensor:
        """``cross_attention_kv``: what ``cross_attention_kv(encoder_hidden_states)`` returns, to
        use instead of projecting the text states again (the same numbers, computed once)."""
        self._check_inputs(sample, encoder_hidden_states, timestep_cond, cross_attention_kwargs)
        context = self._context(encoder_hidden_states, cross_attention_kv)
        config = self.config
        if config.center_input_sample:
            sample = sample * 2.0 - 1.0
        t_emb = self.time_proj(batch_timesteps(timestep, sample, OWNER)).to(dtype=self.dtype)
        emb = self.time_embedding(t_emb, timestep_cond)
        class_emb = self._class_embedding(class_labels, sample)
        if class_emb is not None:
            emb = tc.cat([emb, class_emb], axis=-1) if config.class_embeddings_concat else emb + class_emb
        if self.add_embedding is not None:
            emb = emb + self._text_time_embedding(added_cond_kwargs, sample.shape[0])
        if config.time_embedding_act_fn is not None:
            emb = activation(config.time_embedding_act_fn.lower())(emb)

        h = unet_path(self, self.conv_in(sample), emb, context)
        return self.conv_out(group_norm_act(self.conv_norm_out, h, config.act_fn.lower()))

    def cross_attention_kv(self, encoder_hidden_states: Tensor) -> list[tuple[Tensor, Tensor]]:
        """The keys and values [B, heads, L, dim_head] every cross-attention layer makes of
        ``encoder_hidden_states``, in module order.  They are the same at every step of a
        generation, so a pipeline computes them once and passes them to each call."""
        return [tuple(t.contiguous() for t in layer.keys_values(encoder_hidden_states))
                for layer in self._cross_attention_layers()]

    def _cross_attention_layers(self) -> list[Attention]:
        """The attention layers that read the context, in module order (found once per structure)."""
        version, layers = self.__dict__.get("_cross_layers", (None, None))
        if version != self.structure_version:
            layers = [m for m in self.modules() if isinstance(m, Attention) and m.cross_attention_dim is not None]
            self.__dict__["_cross_layers"] = (self.structure_version, layers)
        return layers

    def _context(self, states: Tensor, kv: Sequence[tuple[Tensor, Tensor]] | None) -> Tensor | TextStates:
        """The context the transformers read: the text states, with their keys and values when given."""
        if kv is None:
            return states
        layers = self._cross_attention_layers()
        if len(kv) != len(layers) or any(len(pair) != 2 for pair in kv):
            raise ValueError(f"{OWNER}: cross_attention_kv must hold a (keys, values) pair for each of the "
                             f"{len(layers)} cross-attention layers, got {len(kv)} entries")
        return TextStates(states, {id(layer): tuple(pair) for layer, pair in zip(layers, kv)})

    def _check_inputs(self, sample: Tensor, context: Tensor, timestep_cond: Tensor | None,
                      cross_attention_kwargs: Mapping[str, Any] | None) -> None:
        config = self.config
        if not isinstance(sample, Tensor) or sample.ndim != 4 or sample.shape[1] != config.in_channels:
            got = sample.shape if isinstance(sample, Tensor) else type(sample).__name__
            raise ValueError(f"{OWNER}: sample must be [B, {config.in_channels}, H, W], got {got}")
        if not isinstance(context, Tensor) or context.ndim != 3 or context.shape[0] != sample.shape[0] \
                or any(context.shape[2] != d for d in self.context_dims):
            got = context.shape if isinstance(context, Tensor) else type(context).__name__
            dims = self.context_dims[0] if len(self.context_dims) == 1 else f"one of {self.context_dims}"
            raise ValueError(f"{OWNER}: encoder_hidden_states must be [{sample.shape[0]}, L, {dims}], got {got}")
        if context.device != sample.device:
            raise ValueError(f"{OWNER}: encoder_hidden_states is on {context.device}, sample on {sample.device}")
        if timestep_cond is not None and config.time_cond_proj_dim is None:
            raise ValueError(f"{OWNER}: timestep_cond given, but the model has no time_cond_proj_dim")
        if timestep_cond is not None and tuple(timestep_cond.shape) != (sample.shape[0], config.time_cond_proj_dim):
            raise ValueError(f"{OWNER}: timestep_cond must be [{sample.shape[0]}, {config.time_cond_proj_dim}], got {timestep_cond.shape}")
        if cross_attention_kwargs:
            raise ValueError(f"{OWNER}: cross_attention_kwargs {sorted(cross_attention_kwargs)} are not supported")

    def _class_embedding(self, class_labels: Any, sample: Tensor) -> Tensor | None:
        if self.class_embedding is None:
            if class_labels is not None:
                raise ValueError(f"{OWNER}: class_labels given, but the model has no class embedding "
                                 "(num_class_embeds / class_embed_type)")
            return None
        if class_labels is None:
            raise ValueError(f"{OWNER}: class_labels are required: the model is class-conditioned")
        if not isinstance(class_labels, Tensor):
            class_labels = tc.tensor(class_labels, device=sample.device)
        elif class_labels.device != sample.device:
            class_labels = class_labels.to(sample.device)
        if class_labels.shape[0] != sample.shape[0]:
            raise ValueError(f"{OWNER}: class_labels must have {sample.shape[0]} rows, got shape {class_labels.shape}")
        if self.config.class_embed_type == "timestep":
            class_labels = self.time_proj(class_labels).to(dtype=self.dtype)
        elif self.config.class_embed_type in ("projection", "simple_projection", "identity"):
            class_labels = class_labels.to(dtype=self.dtype)
        return self.class_embedding(class_labels).to(dtype=self.dtype)

    def _text_time_embedding(self, added: Mapping[str, Tensor] | None, batch: int) -> Tensor:
        """SDXL's added conditioning: ``add_embedding([text_embeds | sinusoids of time_ids])``."""
        missing = [k for k in ("text_embeds", "time_ids") if not added or k not in added]
        if missing:
            raise ValueError(f"{OWNER}: addition_embed_type='text_time' needs added_cond_kwargs {missing}")
        text_embeds, time_ids = added["text_embeds"], added["time_ids"]
        width = self.config.projection_class_embeddings_input_dim
        if text_embeds.ndim != 2 or text_embeds.shape[0] != batch or time_ids.ndim != 2 or time_ids.shape[0] != batch \
                or text_embeds.shape[1] + time_ids.shape[1] * self.config.addition_time_embed_dim != width:
            raise ValueError(f"{OWNER}: text_embeds [B, T] and time_ids [B, N] need B = {batch} and T + N * "
                             f"{self.config.addition_time_embed_dim} = {width}, got {text_embeds.shape} and {time_ids.shape}")
        time_embeds = self.add_time_proj(time_ids.flatten()).reshape(batch, -1)
        add_embeds = tc.cat([text_embeds.to(dtype=time_embeds.dtype), time_embeds], axis=-1).to(dtype=self.dtype)
        return self.add_embedding(add_embeds)


def _class_embedding(c: Mapping[str, Any], time_embed_dim: int, timestep_input_dim: int) -> Module | None:
    """The module ``class_embed_type`` / ``num_class_embeds`` name (diffusers' ``class_embedding``), or None."""
    kind = c["class_embed_type"]
    if kind is None:
        return None if c["num_class_embeds"] is None else Embedding(c["num_class_embeds"], time_embed_dim)
    if kind == "timestep":
        return TimestepEmbedding(timestep_input_dim, time_embed_dim, c["act_fn"])
    if kind == "identity":
        return Identity()
    if kind == "projection":
        return TimestepEmbedding(c["projection_class_embeddings_input_dim"], time_embed_dim)
    return Linear(c["projection_class_embeddings_input_dim"], time_embed_dim)
