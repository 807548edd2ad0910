"""The UNet's and the VAE's down, mid and up blocks, named as diffusers names their parts.

A block is a stack of ResnetBlock2Ds (``resnets.i``), optionally each followed by an
Attention or a Transformer2DModel (``attentions.i``) and, for UNet2D's context
conditioning, a cross-attention (``cross_attentions.i``), then an optional resampler
(``downsamplers.0`` / ``upsamplers.0``).  One class per role covers diffusers' variants:
``DownBlock2D``, ``AttnDownBlock2D``, ``CrossAttnDownBlock2D``, ``DownEncoderBlock2D`` and
``AttnDownEncoderBlock2D`` differ only in their attention (an ``AttentionSpec``, a
``TransformerSpec`` or none) and whether there is a timestep embedding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import tensorcore as tc
from layers import Module, ModuleList
from tensorcore import Tensor

from .attention import Attention
from .resnet import ResnetBlock2D
from .sampling import Downsample2D, Upsample2D
from .transformer_2d import Transformer2DModel

# block type -> whether it has attention
DOWN_BLOCK_TYPES = {"DownBlock2D": False, "AttnDownBlock2D": True}
UP_BLOCK_TYPES = {"UpBlock2D": False, "AttnUpBlock2D": True}
ENCODER_BLOCK_TYPES = {"DownEncoderBlock2D": False, "AttnDownEncoderBlock2D": True}
DECODER_BLOCK_TYPES = {"UpDecoderBlock2D": False, "AttnUpDecoderBlock2D": True}
RESAMPLE_TYPES = ("conv", "resnet")


@dataclass(frozen=True)
class ResnetSpec:
    """What every ResnetBlock2D of a model shares."""

    temb_channels: int | None
    groups: int
    eps: float
    act_fn: str = "silu"
    time_embedding_norm: str = "default"
    dropout: float = 0.0
    output_scale_factor: float = 1.0

    def build(self, in_channels: int, out_channels: int, up: bool = False, down: bool = False) -> ResnetBlock2D:
        return ResnetBlock2D(in_channels, out_channels, self.temb_channels, self.groups, eps=self.eps, act_fn=self.act_fn,
                             time_embedding_norm=self.time_embedding_norm, dropout=self.dropout,
                             output_scale_factor=self.output_scale_factor, up=up, down=down)


@dataclass(frozen=True)
class AttentionSpec:
    """How a block's attention layers are made: ``head_dim`` channels per head (None: one head)."""

    head_dim: int | None
    groups: int | None
    eps: float
    cross_attention_dim: int | None = None
    rescale_output_factor: float = 1.0
    takes_context: ClassVar[bool] = False

    def _heads(self, channels: int) -> tuple[int, int]:
        head_dim = self.head_dim or channels
        if channels % head_dim:
            raise ValueError(f"attention_head_dim={head_dim} must divide the {channels} channels of an attention block")
        return channels // head_dim, head_dim

    def build(self, channels: int) -> Attention:
        heads, head_dim = self._heads(channels)
        return Attention(channels, heads, head_dim, self.groups, self.eps, rescale_output_factor=self.rescale_output_factor)

    def build_cross(self, channels: int) -> Attention:
        heads, head_dim = self._heads(channels)
        return Attention(channels, heads, head_dim, self.groups, self.eps, cross_attention_dim=self.cross_attention_dim)

    def layers(self, channels: int, count: int) -> list[Module]:
        return [self.build(channels) for _ in range(count)]


@dataclass(frozen=True)
class TransformerSpec:
    """How a block's Transformer2DModels are made (diffusers' cross-attention blocks).

    ``heads`` heads of ``channels // heads`` channels; ``depth`` BasicTransformerBlocks in
    each transformer, or one count per transformer of the block.
    """

    heads: int
    cross_attention_dim: int
    groups: int
    depth: int | tuple[int, ...] = 1
    use_linear_projection: bool = False
    only_cross_attention: bool = False
    upcast_attention: bool = False
    dropout: float = 0.0
    takes_context: ClassVar[bool] = True

    def layers(self, channels: int, count: int) -> list[Module]:
        depths = (self.depth,) * count if isinstance(self.depth, int) else self.depth
        if len(depths) != count:
            raise ValueError(f"transformer_layers_per_block: {len(depths)} counts {list(depths)} for a block of {count} layers")
        return [Transformer2DModel(self.heads, channels // self.heads, channels, self.cross_attention_dim, depth,
                                   self.groups, self.use_linear_projection, self.only_cross_attention,
                                   self.upcast_attention, self.dropout) for depth in depths]


class _AttentionStack(Module):
    """Resnets each followed by attention (and cross-attention) when the block has them."""

    def _build_attention(self, attention: AttentionSpec | TransformerSpec | None, channels: int, count: int) -> None:
        self.attentions = None if attention is None else ModuleList(attention.layers(channels, count))
        self.attention_takes_context = attention is not None and attention.takes_context
        cross = isinstance(attention, AttentionSpec) and attention.cross_attention_dim is not None
        self.cross_attentions = ModuleList([attention.build_cross(channels) for _ in range(count)]) if cross else None

    def _attend(self, i: int, h: Tensor, context: Tensor | None) -> Tensor:
        if self.attentions is not None:
            h = self.attentions[i](h, context) if self.attention_takes_context else self.attentions[i](h)
        if self.cross_attentions is not None:
            h = self.cross_attentions[i](h, context)
        return h


class DownBlock2D(_AttentionStack):
    """``num_layers`` resnets (+ attention) at one resolution, then an optional downsampler.

    ``forward`` returns the block's output and the states the up path takes as skips
    (each layer's output, then the downsampled one).
    """

    def __init__(self, in_channels: int, out_channels: int, num_layers: int, resnet: ResnetSpec,
                 attention: AttentionSpec | TransformerSpec | None = None, add_downsample: bool = True,
                 downsample_type: str = "conv", downsample_padding: int = 1) -> None:
        super().__init__()
        self.resnets = ModuleList([resnet.build(in_channels if i == 0 else out_channels, out_channels)
                                   for i in range(num_layers)])
        self._build_attention(attention, out_channels, num_layers)
        self.downsample_type = downsample_type if add_downsample else None
        if not add_downsample:
            self.downsamplers = None
        elif downsample_type == "conv":
            self.downsamplers = ModuleList([Downsample2D(out_channels, padding=downsample_padding)])
        else:
            self.downsamplers = ModuleList([resnet.build(out_channels, out_channels, down=True)])

    def forward(self, h: Tensor, temb: Tensor | None = None, context: Tensor | None = None) -> tuple[Tensor, list[Tensor]]:
        states = []
        for i, resnet in enumerate(self.resnets):
            h = self._attend(i, resnet(h, temb), context)
            states.append(h)
        if self.downsamplers is not None:
            sampler = self.downsamplers[0]
            h = sampler(h, temb) if self.downsample_type == "resnet" else sampler(h)
            states.append(h)
        return h, states


class UpBlock2D(_AttentionStack):
    """``len(in_channels)`` resnets (+ attention), then an optional upsampler.

    ``in_channels[i]`` is resnet i's input width.  In a UNet each resnet first
    concatenates the next skip state (popped from the end) to its input; the VAE
    decoder's blocks take no skips.
    """

    def __init__(self, in_channels: Sequence[int], out_channels: int, resnet: ResnetSpec,
                 attention: AttentionSpec | TransformerSpec | None = None, add_upsample: bool = True, upsample_type: str = "conv") -> None:
        super().__init__()
        self.resnets = ModuleList([resnet.build(c, out_channels) for c in in_channels])
        self._build_attention(attention, out_channels, len(in_channels))
        self.upsample_type = upsample_type if add_upsample else None
        if not add_upsample:
            self.upsamplers = None
        elif upsample_type == "conv":
            self.upsamplers = ModuleList([Upsample2D(out_channels)])
        else:
            self.upsamplers = ModuleList([resnet.build(out_channels, out_channels, up=True)])

    def forward(self, h: Tensor, skips: list[Tensor] | None = None, temb: Tensor | None = None,
                context: Tensor | None = None) -> Tensor:
        for i, resnet in enumerate(self.resnets):
            if skips is not None:
                h = tc.cat([h, skips.pop()], axis=1)
            h = self._attend(i, resnet(h, temb), context)
        if self.upsamplers is not None:
            sampler = self.upsamplers[0]
            if self.upsample_type == "resnet":
                h = sampler(h, temb)
            else:  # to the next skip's size, which odd sizes on the way down make less than double
                h = sampler(h, tuple(skips[-1].shape[2:]) if skips else None)
        return h


class UNetMidBlock2D(_AttentionStack):
    """resnet, then ``num_layers`` x (attention, resnet), all at the lowest resolution."""

    def __init__(self, channels: int, resnet: ResnetSpec, attention: AttentionSpec | TransformerSpec | None,
                 num_layers: int = 1) -> None:
        super().__init__()
        self.resnets = ModuleList([resnet.build(channels, channels) for _ in range(num_layers + 1)])
        self._build_attention(attention, channels, num_layers)

    def forward(self, h: Tensor, temb: Tensor | None = None, context: Tensor | None = None) -> Tensor:
        h = self.resnets[0](h, temb)
        for i in range(len(self.resnets) - 1):
            h = self.resnets[i + 1](self._attend(i, h, context), temb)
        return h


def check_block_types(owner: str, key: str, types: Sequence[str], known: dict[str, bool]) -> list[bool]:
    """Whether each named block has attention; unknown names raise ValueError listing the known ones."""
    unknown = [t for t in types if t not in known]
    if unknown:
        raise ValueError(f"{owner}: {key} {unknown} not supported; choose from {list(known)}")
    return [known[t] for t in types]


def unet_path(unet: Any, h: Tensor, emb: Tensor, context: Tensor | None) -> Tensor:
    """A UNet's down path (each block's states kept for the skips), middle (if any) and up
    path, from ``conv_in``'s output ``h`` to what ``conv_norm_out`` reads."""
    skips = [h]
    for block in unet.down_blocks:
        h, states = block(h, emb, context)
        skips.extend(states)
    if unet.mid_block is not None:
        h = unet.mid_block(h, emb, context)
    for block in unet.up_blocks:
        h = block(h, skips, emb, context)
    return h
