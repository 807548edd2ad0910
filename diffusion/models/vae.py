"""The VAE's Encoder (image -> latent moments) and Decoder (latent -> image), named as diffusers' ``vae.py``."""

from __future__ import annotations

from typing import Sequence

from layers import Conv2d, GroupNorm, Module, ModuleList
from tensorcore import Tensor

from .activations import group_norm_act
from .blocks import (DECODER_BLOCK_TYPES, ENCODER_BLOCK_TYPES, AttentionSpec, DownBlock2D, ResnetSpec, UNetMidBlock2D,
                     UpBlock2D, check_block_types)

VAE_EPS = 1e-6  # diffusers' VAE uses this GroupNorm eps everywhere


class Encoder(Module):
    """conv_in -> down blocks (stride-2 convs between levels) -> mid block -> norm, SiLU, conv_out.

    Returns ``2 * out_channels`` channels (mean and log-variance) when ``double_z``.
    """

    def __init__(self, in_channels: int, out_channels: int, down_block_types: Sequence[str],
                 block_out_channels: Sequence[int], layers_per_block: int, norm_num_groups: int, act_fn: str,
                 double_z: bool = True, mid_block_add_attention: bool = True) -> None:
        super().__init__()
        channels = list(block_out_channels)
        with_attention = check_block_types("Encoder", "down_block_types", down_block_types, ENCODER_BLOCK_TYPES)
        resnet = ResnetSpec(None, norm_num_groups, VAE_EPS, act_fn)
        attention = AttentionSpec(None, norm_num_groups, VAE_EPS)  # one head as wide as the block
        self.conv_in = Conv2d(in_channels, channels[0], 3, padding=1)
        self.down_blocks = ModuleList([
            DownBlock2D(channels[max(i - 1, 0)], channels[i], layers_per_block, resnet,
                        attention if attend else None, add_downsample=i < len(channels) - 1, downsample_padding=0)
            for i, attend in enumerate(with_attention)])
        self.mid_block = UNetMidBlock2D(channels[-1], resnet, attention if mid_block_add_attention else None)
        self.conv_norm_out = GroupNorm(norm_num_groups, channels[-1], eps=VAE_EPS)
        self.conv_out = Conv2d(channels[-1], 2 * out_channels if double_z else out_channels, 3, padding=1)

    def forward(self, sample: Tensor) -> Tensor:
        h = self.conv_in(sample)
        for block in self.down_blocks:
            h, _ = block(h)
        h = self.mid_block(h)
        return self.conv_out(group_norm_act(self.conv_norm_out, h, "silu"))


class Decoder(Module):
    """conv_in -> mid block -> up blocks (nearest x2 + conv between levels) -> norm, SiLU, conv_out."""

    def __init__(self, in_channels: int, out_channels: int, up_block_types: Sequence[str],
                 block_out_channels: Sequence[int], layers_per_block: int, norm_num_groups: int, act_fn: str,
                 mid_block_add_attention: bool = True) -> None:
        super().__init__()
        reversed_channels = list(block_out_channels)[::-1]
        with_attention = check_block_types("Decoder", "up_block_types", up_block_types, DECODER_BLOCK_TYPES)
        resnet = ResnetSpec(None, norm_num_groups, VAE_EPS, act_fn)
        attention = AttentionSpec(None, norm_num_groups, VAE_EPS)
        self.conv_in = Conv2d(in_channels, reversed_channels[0], 3, padding=1)
        self.mid_block = UNetMidBlock2D(reversed_channels[0], resnet, attention if mid_block_add_attention else None)
        self.up_blocks = ModuleList()
        for i, attend in enumerate(with_attention):
            out = reversed_channels[i]
            inputs = [reversed_channels[max(i - 1, 0)]] + [out] * layers_per_block
            self.up_blocks.append(UpBlock2D(inputs, out, resnet, attention if attend else None,
                                            add_upsample=i < len(reversed_channels) - 1))
        self.conv_norm_out = GroupNorm(norm_num_groups, reversed_channels[-1], eps=VAE_EPS)
        self.conv_out = Conv2d(reversed_channels[-1], out_channels, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            h = block(h)
        return self.conv_out(group_norm_act(self.conv_norm_out, h, "silu"))
