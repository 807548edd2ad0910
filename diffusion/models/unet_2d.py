"""UNet2D: the noise predictor, configured and named as diffusers' ``UNet2DModel``.

Every ``UNet2DModel`` config key means the same here and a diffusers checkpoint loads
as it is.  Beyond diffusers: ``cross_attention_dim`` adds a cross-attention after every
attention layer, attending to a ``context`` sequence [B, L, cross_attention_dim].
Defaults differ from ``UNet2DModel`` in one respect: attention sits at the lowest
resolution only (attention over 64x64 and larger maps costs gigabytes), so the default
block types are plain except the deepest level.
"""

from __future__ import annotations

from dataclasses import replace
from numbers import Integral, Real
from typing import Any, Mapping, Sequence

import tensorcore as tc
from layers import Conv2d, Embedding, GroupNorm, Identity, ModuleList
from tensorcore import Tensor

from .activations import check_activation, group_norm_act
from .blocks import (DOWN_BLOCK_TYPES, RESAMPLE_TYPES, UP_BLOCK_TYPES, AttentionSpec, DownBlock2D, ResnetSpec,
                     UNetMidBlock2D, UpBlock2D, check_block_types, unet_path)
from .bounds import conv_net_shares, count, flag, list_of, name, number, optional, size_or_pair, width
from .config import register_to_config
from .embeddings import GaussianFourierProjection, TimestepEmbedding, Timesteps
from .pretrained import PretrainedModel
from .resnet import TIME_EMBEDDING_NORMS

TIME_EMBEDDING_TYPES = ("positional", "fourier", "learned")
CLASS_EMBED_TYPES = (None, "timestep", "identity")


class UNet2D(PretrainedModel):
    """``unet(sample, timestep, class_labels=None, context=None)`` -> the prediction, shaped like ``sample``.

    ``sample`` is [B, in_channels, H, W] with H and W multiples of 2^(levels - 1);
    ``timestep`` a number, a 0-d tensor or one value per batch element (a tensor stays
    on its device: it is never read back to the host).
    """

    diffusers_class = "UNet2DModel"
    diffusers_defaults = {
        "down_block_types": ("DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"),
        "up_block_types": ("AttnUpBlock2D", "AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
    }

    config_bounds = {
        "sample_size": optional(size_or_pair()), "in_channels": width(), "out_channels": width(),
        "center_input_sample": flag(), "time_embedding_type": name(), "time_embedding_dim": optional(width()),
        "freq_shift": number(), "flip_sin_to_cos": flag(), "down_block_types": list_of(name()),
        "mid_block_type": optional(name()), "up_block_types": list_of(name()), "block_out_channels": list_of(width()),
        "layers_per_block": count(), "mid_block_scale_factor": number(), "downsample_padding": count(0),
        "downsample_type": name(), "upsample_type": name(), "dropout": number(), "act_fn": name(),
        "attention_head_dim": optional(width()), "norm_num_groups": width(), "attn_norm_num_groups": optional(width()),
        "norm_eps": number(), "resnet_time_scale_shift": name(), "add_attention": flag(),
        "class_embed_type": optional(name()), "num_class_embeds": optional(width()),
        "num_train_timesteps": optional(width()), "cross_attention_dim": optional(width()),
    }

    @staticmethod
    def parameter_shares(config: Mapping[str, Any]) -> dict[tuple[str, ...], int]:
        """``conv_net_shares`` plus the embedding tables: class labels and learned timesteps."""
        shares = conv_net_shares(config)
        first = config["block_out_channels"][0]
        time_dim = config["time_embedding_dim"] or 4 * first
        if config["class_embed_type"] is None:
            shares[("num_class_embeds",)] = (config["num_class_embeds"] or 0) * time_dim
        if config["time_embedding_type"] == "learned":
            shares[("num_train_timesteps",)] = (config["num_train_timesteps"] or 0) * first
        return shares

    @register_to_config
    def __init__(self, sample_size: int | Sequence[int] | None = None, in_channels: int = 3, out_channels: int = 3,
                 center_input_sample: bool = False, time_embedding_type: str = "positional",
                 time_embedding_dim: int | None = None, freq_shift: float = 0, flip_sin_to_cos: bool = True,
                 down_block_types: Sequence[str] = ("DownBlock2D", "DownBlock2D", "DownBlock2D", "AttnDownBlock2D"),
                 mid_block_type: str | None = "UNetMidBlock2D",
                 up_block_types: Sequence[str] = ("AttnUpBlock2D", "UpBlock2D", "UpBlock2D", "UpBlock2D"),
                 block_out_channels: Sequence[int] = (224, 448, 672, 896), layers_per_block: int = 2,
                 mid_block_scale_factor: float = 1, downsample_padding: int = 1, downsample_type: str = "conv",
                 upsample_type: str = "conv", dropout: float = 0.0, act_fn: str = "silu",
                 attention_head_dim: int | None = 8, norm_num_groups: int = 32, attn_norm_num_groups: int | None = None,
                 norm_eps: float = 1e-5, resnet_time_scale_shift: str = "default", add_attention: bool = True,
                 class_embed_type: str | None = None, num_class_embeds: int | None = None,
                 num_train_timesteps: int | None = None, cross_attention_dim: int | None = None) -> None:
        super().__init__()
        channels = list(block_out_channels)
        down_attention = check_block_types("UNet2D", "down_block_types", down_block_types, DOWN_BLOCK_TYPES)
        up_attention = check_block_types("UNet2D", "up_block_types", up_block_types, UP_BLOCK_TYPES)
        _check_config(channels, down_block_types, up_block_types, mid_block_type, downsample_type, upsample_type,
                      resnet_time_scale_shift, time_embedding_type, num_train_timesteps, class_embed_type)
        has_attention = any(down_attention) or any(up_attention) or (mid_block_type is not None and add_attention)
        if cross_attention_dim is not None and not has_attention:
            raise ValueError("UNet2D: cross_attention_dim needs at least one attention layer to attend from")
        check_activation(act_fn, "UNet2D")
        self.levels = len(channels)
        time_embed_dim = time_embedding_dim or channels[0] * 4

        self.conv_in = Conv2d(in_channels, channels[0], 3, padding=1)
        self.time_proj, timestep_input_dim = _time_projection(time_embedding_type, channels[0], flip_sin_to_cos,
                                                              freq_shift, num_train_timesteps)
        self.time_embedding = TimestepEmbedding(timestep_input_dim, time_embed_dim)
        if class_embed_type is None and num_class_embeds is not None:
            self.class_embedding = Embedding(num_class_embeds, time_embed_dim)
        elif class_embed_type == "timestep":
            self.class_embedding = TimestepEmbedding(timestep_input_dim, time_embed_dim)
        elif class_embed_type == "identity":
            self.class_embedding = Identity()
        else:
            self.class_embedding = None

        resnet = ResnetSpec(time_embed_dim, norm_num_groups, norm_eps, act_fn, resnet_time_scale_shift, dropout)
        attention = AttentionSpec(attention_head_dim, norm_num_groups, norm_eps, cross_attention_dim)
        self.down_blocks = ModuleList()
        for i, with_attention in enumerate(down_attention):
            self.down_blocks.append(DownBlock2D(
                channels[max(i - 1, 0)], channels[i], layers_per_block, resnet, attention if with_attention else None,
                add_downsample=i < self.levels - 1, downsample_type=downsample_type if with_attention else "conv",
                downsample_padding=downsample_padding))

        self.mid_block = None
        if mid_block_type is not None:
            mid_groups = attn_norm_num_groups
            if mid_groups is None and resnet_time_scale_shift == "default":
                mid_groups = norm_num_groups
            mid_attention = AttentionSpec(attention_head_dim, mid_groups, norm_eps, cross_attention_dim,
                                          rescale_output_factor=mid_block_scale_factor)
            self.mid_block = UNetMidBlock2D(channels[-1], replace(resnet, output_scale_factor=mid_block_scale_factor),
                                            mid_attention if add_attention else None)

        self.up_blocks = ModuleList()
        reversed_channels = channels[::-1]
        for i, with_attention in enumerate(up_attention):
            out = reversed_channels[i]
            skip_last = reversed_channels[min(i + 1, self.levels - 1)]
            inputs = [(reversed_channels[max(i - 1, 0)] if j == 0 else out) + (skip_last if j == layers_per_block else out)
                      for j in range(layers_per_block + 1)]
            self.up_blocks.append(UpBlock2D(
                inputs, out, resnet, attention if with_attention else None, add_upsample=i < self.levels - 1,
                upsample_type=upsample_type if with_attention else "conv"))

        self.conv_norm_out = GroupNorm(norm_num_groups, channels[0], eps=norm_eps)
        self.conv_out = Conv2d(channels[0], out_channels, 3, padding=1)

    @classmethod
    def reference(cls) -> "UNet2D":
        """The benchmark network (57,569,284 parameters): three levels of 128/256/512 channels,
        no attention in the levels, one 8-head attention in the middle."""
        return cls(in_channels=4, out_channels=4, block_out_channels=(128, 256, 512),
                   down_block_types=("DownBlock2D",) * 3, up_block_types=("UpBlock2D",) * 3,
                   layers_per_block=2, attention_head_dim=64, norm_num_groups=32)

    def forward(self, sample: Tensor, timestep: Any, class_labels: Any = None, context: Tensor | None = None) -> Tensor:
        self._check_inputs(sample, context)
        config = self.config
        if config.center_input_sample:
            sample = sample * 2.0 - 1.0
        timesteps = batch_timesteps(timestep, sample)
        emb = self.time_embedding(self.time_proj(self._time_input(timesteps)).to(dtype=self.dtype))
        if self.class_embedding is not None:
            emb = emb + self._class_embedding(class_labels, sample)
        elif class_labels is not None:
            raise ValueError("UNet2D: class_labels given, but the model has no class embedding (num_class_embeds / class_embed_type)")

        h = unet_path(self, self.conv_in(sample), emb, context)
        h = self.conv_out(group_norm_act(self.conv_norm_out, h, "silu"))
        if config.time_embedding_type == "fourier":
            h = h / timesteps.to(dtype=h.dtype).reshape(-1, 1, 1, 1)
        return h

    def _check_inputs(self, sample: Tensor, context: Tensor | None) -> None:
        config = self.config
        factor = 2 ** (self.levels - 1)
        if not isinstance(sample, Tensor) or sample.ndim != 4 or sample.shape[1] != config.in_channels:
            got = sample.shape if isinstance(sample, Tensor) else type(sample).__name__
            raise ValueError(f"UNet2D: sample must be [B, {config.in_channels}, H, W], got {got}")
        if sample.shape[2] % factor or sample.shape[3] % factor:
            raise ValueError(f"UNet2D: sample height and width must be multiples of {factor}, got {sample.shape[2:]}")
        if config.cross_attention_dim is None and context is not None:
            raise ValueError("UNet2D: context given, but the model has no cross-attention (cross_attention_dim)")
        if config.cross_attention_dim is not None:
            if not isinstance(context, Tensor) or context.ndim != 3 or context.shape[0] != sample.shape[0] \
                    or context.shape[2] != config.cross_attention_dim:
                got = context.shape if isinstance(context, Tensor) else context
                raise ValueError(f"UNet2D: context must be [{sample.shape[0]}, L, {config.cross_attention_dim}], got {got}")
            if context.device != sample.device:
                raise ValueError(f"UNet2D: context is on {context.device}, sample on {sample.device}")

    def _time_input(self, timesteps: Tensor) -> Tensor:
        """Learned embeddings take integer timesteps; the others take them as they are."""
        return timesteps.to(dtype=tc.int64) if self.config.time_embedding_type == "learned" else timesteps

    def _class_embedding(self, class_labels: Any, sample: Tensor) -> Tensor:
        if class_labels is None:
            raise ValueError("UNet2D: class_labels are required: the model is class-conditioned")
        if not isinstance(class_labels, Tensor):
            class_labels = tc.tensor(class_labels, device=sample.device)
        elif class_labels.device != sample.device:
            class_labels = class_labels.to(sample.device)
        if self.config.class_embed_type == "timestep":
            class_labels = self.time_proj(class_labels).to(dtype=self.dtype)
        elif self.config.class_embed_type is None and class_labels.shape != (sample.shape[0],):
            raise ValueError(f"UNet2D: class_labels must be [{sample.shape[0]}] integers, got shape {class_labels.shape}")
        return self.class_embedding(class_labels).to(dtype=self.dtype)


def batch_timesteps(timestep: Any, sample: Tensor, owner: str = "UNet2D") -> Tensor:
    """``timestep`` as a [B] tensor on ``sample``'s device: a number is filled in, a 0-d or
    one-element tensor broadcast; device tensors are never read to the host."""
    batch = sample.shape[0]
    if isinstance(timestep, Tensor):
        if timestep.ndim > 1 or (timestep.ndim == 1 and timestep.shape[0] not in (1, batch)):
            raise ValueError(f"{owner}: timestep must be a scalar or have shape [{batch}], got {timestep.shape}")
        if timestep.device != sample.device:
            timestep = timestep.to(sample.device)
        return timestep.reshape(1).expand(batch) if timestep.numel() == 1 else timestep
    if isinstance(timestep, Real) and not isinstance(timestep, bool):
        dtype = tc.int64 if isinstance(timestep, Integral) else tc.float32
        return tc.full((batch,), timestep, dtype=dtype, device=sample.device)
    raise TypeError(f"{owner}: timestep must be a number or a Tensor, got {type(timestep).__name__}")


def _time_projection(kind: str, channels: int, flip_sin_to_cos: bool, freq_shift: float,
                     num_train_timesteps: int | None) -> tuple[Any, int]:
    """The timestep featurizer named by ``time_embedding_type`` and the width of its output."""
    if kind == "fourier":
        return GaussianFourierProjection(embedding_size=channels, scale=16), 2 * channels
    if kind == "learned":
        return Embedding(num_train_timesteps, channels), channels
    return Timesteps(channels, flip_sin_to_cos, freq_shift), channels


def _check_config(channels: list[int], down_block_types: Sequence[str], up_block_types: Sequence[str],
                  mid_block_type: str | None, downsample_type: str, upsample_type: str, resnet_time_scale_shift: str,
                  time_embedding_type: str, num_train_timesteps: int | None, class_embed_type: str | None) -> None:
    """Raise ValueError naming the first config value UNet2D cannot build."""
    if not channels or len(down_block_types) != len(channels) or len(up_block_types) != len(channels):
        raise ValueError(f"UNet2D: block_out_channels ({len(channels)}), down_block_types ({len(down_block_types)}) "
                         f"and up_block_types ({len(up_block_types)}) must have the same positive length")
    choices = [("mid_block_type", mid_block_type, ("UNetMidBlock2D", None)),
               ("downsample_type", downsample_type, RESAMPLE_TYPES), ("upsample_type", upsample_type, RESAMPLE_TYPES),
               ("resnet_time_scale_shift", resnet_time_scale_shift, TIME_EMBEDDING_NORMS),
               ("time_embedding_type", time_embedding_type, TIME_EMBEDDING_TYPES),
               ("class_embed_type", class_embed_type, CLASS_EMBED_TYPES)]
    for key, value, valid in choices:
        if value not in valid:
            raise ValueError(f"UNet2D: {key} must be one of {valid}, got {value!r}")
    if time_embedding_type == "learned" and not num_train_timesteps:
        raise ValueError("UNet2D: time_embedding_type='learned' needs num_train_timesteps")
