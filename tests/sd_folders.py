"""Tiny random Stable Diffusion folders made with diffusers and transformers (the oracles), on
the real CLIP vocabulary: what ``from_pretrained`` of both sides reads in the pipeline tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clip_vocab import VOCAB_SIZE, write_clip_folder

# A two-level UNet with cross-attention at the second level, 8x8 latents (16x16 images).
UNET = dict(block_out_channels=(16, 32), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            norm_num_groups=8, attention_head_dim=4, cross_attention_dim=32)
XL_UNET = dict(UNET, attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
               addition_time_embed_dim=8, transformer_layers_per_block=(1, 2),
               projection_class_embeddings_input_dim=6 * 8 + 16, cross_attention_dim=32 + 16)
VAE = dict(block_out_channels=(8, 16), in_channels=3, out_channels=3, latent_channels=4, norm_num_groups=4,
           down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, sample_size=16)
SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                 set_alpha_to_one=False, steps_offset=1)


def text_config(hidden: int, layers: int = 3, projection: int | None = None) -> Any:
    import transformers

    extra = {} if projection is None else {"projection_dim": projection}
    return transformers.CLIPTextConfig(hidden_size=hidden, intermediate_size=2 * hidden + 5, num_attention_heads=4,
                                       num_hidden_layers=layers, vocab_size=VOCAB_SIZE, max_position_embeddings=77,
                                       bos_token_id=VOCAB_SIZE - 2, eos_token_id=VOCAB_SIZE - 1, pad_token_id=VOCAB_SIZE - 1,
                                       hidden_act="quick_gelu", **extra)


def sd_folder(folder: Path, lcm: bool = False, seed: int = 0) -> Path:
    """An SD-1.x-style folder (DDIM scheduler; an LCM UNet with ``time_cond_proj_dim`` when ``lcm``)."""
    import diffusers
    import torch
    import transformers

    torch.manual_seed(seed)
    unet = diffusers.UNet2DConditionModel(**UNET, time_cond_proj_dim=16 if lcm else None)
    vae = diffusers.AutoencoderKL(**VAE)
    text_encoder = transformers.CLIPTextModel(text_config(32))
    tokenizer = transformers.CLIPTokenizer.from_pretrained(write_clip_folder(folder / "_vocab", "<|endoftext|>"))
    scheduler = diffusers.DDIMScheduler(**SCHEDULER)
    pipe = diffusers.StableDiffusionPipeline(vae=vae, text_encoder=text_encoder.eval(), tokenizer=tokenizer,
                                             unet=unet.eval(), scheduler=scheduler, safety_checker=None,
                                             feature_extractor=None, requires_safety_checker=False)
    pipe.save_pretrained(folder, safe_serialization=True)
    return folder


def xl_folder(folder: Path, seed: int = 0) -> Path:
    """An SDXL-style folder: two text encoders (the second with a projection) and ``text_time`` conditioning."""
    import diffusers
    import torch
    import transformers

    torch.manual_seed(seed)
    unet = diffusers.UNet2DConditionModel(**XL_UNET)
    vae = diffusers.AutoencoderKL(**VAE)
    text_encoder = transformers.CLIPTextModel(text_config(32))
    text_encoder_2 = transformers.CLIPTextModelWithProjection(text_config(16, projection=16))
    tokenizer = transformers.CLIPTokenizer.from_pretrained(write_clip_folder(folder / "_vocab", "<|endoftext|>"))
    tokenizer_2 = transformers.CLIPTokenizer.from_pretrained(write_clip_folder(folder / "_vocab2", "!"))
    scheduler = diffusers.EulerDiscreteScheduler(**{k: v for k, v in SCHEDULER.items()
                                                    if k not in ("clip_sample", "set_alpha_to_one")})
    pipe = diffusers.StableDiffusionXLPipeline(vae=vae, text_encoder=text_encoder.eval(),
                                               text_encoder_2=text_encoder_2.eval(), tokenizer=tokenizer,
                                               tokenizer_2=tokenizer_2, unet=unet.eval(), scheduler=scheduler)
    pipe.save_pretrained(folder, safe_serialization=True)
    return folder
