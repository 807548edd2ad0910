"""Stable Diffusion pipelines on the GPU: the full SD-1.5 configs (UNet, VAE, CLIP text encoder)
with random weights in float16, compiled (one chain: text stage, one denoise plan per step,
decode) against the same pipeline run eagerly.

Compiled plans fuse kernels and sum in their own order, so the two agree within float16
rounding compounded over the steps, not bit for bit: the bound is on the [0, 1] images.
The tokenizer is a character-level CLIP tokenizer (the byte alphabet, no merges), so no
vocabulary file is needed on the GPU machine.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorcore as tc
from diffusion import (AutoencoderKL, CLIPTextModel, CLIPTokenizer, PNDMScheduler, StableDiffusionPipeline,
                       UNet2DConditionModel)
from diffusion.tokenizers.clip_bpe import bytes_to_unicode

pytestmark = pytest.mark.gpu

SD15_UNET = dict(sample_size=64, cross_attention_dim=768, attention_head_dim=8)
SD15_VAE = dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(128, 256, 512, 512),
                down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                layers_per_block=2, sample_size=512, scaling_factor=0.18215)
SD15_TEXT = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                 num_attention_heads=12, max_position_embeddings=77, eos_token_id=49407, bos_token_id=49406)
SD15_SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", skip_prk_steps=True,
                      steps_offset=1, set_alpha_to_one=False)
BOUND = 3e-2  # on images in [0, 1], float16


def character_tokenizer() -> CLIPTokenizer:
    """CLIP's byte alphabet (with and without ``</w>``) and its two special tokens, no merges."""
    chars = list(bytes_to_unicode().values())
    tokens = chars + [c + "</w>" for c in chars]
    vocab = {t: i for i, t in enumerate(tokens)}
    vocab.update({"<|startoftext|>": 49406, "<|endoftext|>": 49407})
    config = {"model_max_length": 77, "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
              "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    return CLIPTokenizer(vocab, [], config)


@pytest.fixture(scope="module")
def sd15_parts():
    tc.manual_seed(0)
    unet = UNet2DConditionModel(**SD15_UNET).to("cuda", dtype=tc.float16).eval()
    vae = AutoencoderKL(**SD15_VAE).to("cuda", dtype=tc.float16).eval()
    text = CLIPTextModel(**SD15_TEXT).to("cuda", dtype=tc.float16).eval()
    return vae, text, character_tokenizer(), unet


def test_full_sd15_fp16_compiled_equals_eager_within_bounds(sd15_parts) -> None:
    vae, text, tokenizer, unet = sd15_parts
    scheduler = PNDMScheduler(**SD15_SCHEDULER)
    eager = StableDiffusionPipeline(vae, text, tokenizer, unet, scheduler, compile=False)
    compiled = StableDiffusionPipeline(vae, text, tokenizer, unet, scheduler)
    assert compiled.compile  # the default on the GPU
    kwargs = dict(prompt=["a photo of an astronaut", "a watercolour fox"], negative_prompt="blurry",
                  num_inference_steps=4, guidance_scale=7.5, output_type="np", seed=0, progress=False)
    want = eager(**kwargs)
    compiled(**kwargs)  # traces the plans (the first step of each runs while recording)
    got = compiled(**kwargs)  # every stage replays its plans
    again = compiled(**kwargs)
    assert want.images.shape == (2, 512, 512, 3)
    assert want.nonfinite_count == got.nonfinite_count == 0
    assert np.abs(got.images - want.images).max() <= BOUND
    np.testing.assert_array_equal(again.images, got.images)  # replays are deterministic
    text_info, step_info, decode_info = compiled.chain.cache_info()
    assert step_info.hits >= 4 and step_info.fallbacks == 0 and decode_info.fallbacks == 0
    assert text_info.fallbacks == 0


def random_lora(unet, rank: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    """A LoRA in diffusers' keys on every attention projection of ``unet``."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, module in unet.named_modules():
        if name.rsplit(".", 1)[-1] in ("to_q", "to_k", "to_v") or name.endswith("to_out.0"):
            out_features, in_features = module.weight.shape
            weights[f"unet.{name}.lora_A.weight"] = (rng.standard_normal((rank, in_features)) * 0.05).astype(np.float32)
            weights[f"unet.{name}.lora_B.weight"] = (rng.standard_normal((out_features, rank)) * 0.05).astype(np.float32)
    return weights


def test_full_sd15_fp16_with_a_lora_compiled_runs_the_fused_lora_kernel(sd15_parts) -> None:
    vae, text, tokenizer, unet = sd15_parts
    scheduler = PNDMScheduler(**SD15_SCHEDULER)
    eager = StableDiffusionPipeline(vae, text, tokenizer, unet, scheduler, compile=False)
    compiled = StableDiffusionPipeline(vae, text, tokenizer, unet, scheduler)
    kwargs = dict(prompt="a lighthouse", num_inference_steps=2, output_type="np", seed=0, progress=False)
    base = eager(**kwargs).images
    eager.load_lora_weights(random_lora(unet), adapter_name="style")  # the models are shared: one load serves both
    try:
        want = eager(**kwargs).images
        got = compiled(**kwargs).images
        assert np.abs(want - base).max() > 1e-2
        assert np.abs(got - want).max() <= BOUND
        assert compiled.chain.cache_info()[1].rewrites.get("lora", 0) > 0
    finally:
        eager.unload_lora_weights()
    np.testing.assert_array_equal(eager(**kwargs).images, base)
