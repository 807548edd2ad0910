"""Diffusion models configured and named as diffusers', so its checkpoints load as they are.

    from diffusion import UNet2D, AutoencoderKL
    unet = UNet2D.from_pretrained("path/to/unet")      # a diffusers UNet2DModel folder
    sd_unet = UNet2DConditionModel.from_pretrained("path/to/sd/unet")
    vae = AutoencoderKL.from_pretrained("path/to/vae")
"""

from .attention import Attention
from .autoencoder_kl import AutoencoderKL
from .clip_text import CLIPTextModel, CLIPTextModelWithProjection
from .config import FrozenConfig
from .distributions import DiagonalGaussianDistribution
from .embeddings import GaussianFourierProjection, TimestepEmbedding, Timesteps, get_guidance_scale_embedding
from .resnet import ResnetBlock2D
from .sampling import Downsample2D, Upsample2D
from .transformer_2d import BasicTransformerBlock, Transformer2DModel
from .unet_2d import UNet2D
from .unet_2d_condition import UNet2DConditionModel
from .vae import Decoder, Encoder

__all__ = [
    "UNet2D", "UNet2DConditionModel", "Transformer2DModel", "BasicTransformerBlock", "AutoencoderKL", "DiagonalGaussianDistribution", "FrozenConfig", "Attention", "ResnetBlock2D",
    "Downsample2D", "Upsample2D", "Timesteps", "TimestepEmbedding", "GaussianFourierProjection", "Encoder", "Decoder",
    "CLIPTextModel", "CLIPTextModelWithProjection", "get_guidance_scale_embedding",
]
