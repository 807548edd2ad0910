"""The models the command line trains on the bundled digits, as diffusers configs.

The UNet is a small ``UNet2DModel``: plain ResNet levels with self-attention at the
lowest resolution (and in the middle block), class-conditioned through
``num_class_embeds = classes + 1``, the extra embedding being the null label that
label dropout trains for classifier-free guidance.  The VAE is a small
``AutoencoderKL`` that halves the image side per extra level.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..datasets import NUM_DIGIT_CLASSES

NULL_CLASS_LABEL = NUM_DIGIT_CLASSES  # the label after the ten digits


def norm_groups(channels: Sequence[int]) -> int:
    """The largest group count up to 8 that divides every level's channels."""
    common = math.gcd(*channels)
    return max(g for g in range(1, 9) if common % g == 0)


def unet_config(sample_size: int, channels: Sequence[int], layers_per_block: int, in_channels: int = 1,
                num_classes: int | None = NUM_DIGIT_CLASSES) -> dict[str, Any]:
    levels = len(channels)
    return {"sample_size": sample_size, "in_channels": in_channels, "out_channels": in_channels,
            "block_out_channels": list(channels), "layers_per_block": layers_per_block,
            "down_block_types": ["DownBlock2D"] * (levels - 1) + ["AttnDownBlock2D"],
            "up_block_types": ["AttnUpBlock2D"] + ["UpBlock2D"] * (levels - 1),
            "attention_head_dim": min(32, channels[-1]), "norm_num_groups": norm_groups(channels),
            "num_class_embeds": None if num_classes is None else num_classes + 1}


def vae_config(sample_size: int, channels: Sequence[int], latent_channels: int) -> dict[str, Any]:
    levels = len(channels)
    return {"sample_size": sample_size, "in_channels": 1, "out_channels": 1, "block_out_channels": list(channels),
            "down_block_types": ["DownEncoderBlock2D"] * levels, "up_block_types": ["UpDecoderBlock2D"] * levels,
            "layers_per_block": 1, "latent_channels": latent_channels, "norm_num_groups": norm_groups(channels)}
