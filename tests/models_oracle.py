"""Shared pieces of the model tests: small configs, diffusers twins with random weights,
and loading one side's weights into the other through a diffusers folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import tensorcore as tc
from diffusion import AutoencoderKL, UNet2D

# A two-level UNet with an attention level and class conditioning (diffusers' UNet2DModel keys).
SMALL_UNET = dict(sample_size=8, in_channels=3, out_channels=3, block_out_channels=(16, 32),
                  down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                  layers_per_block=1, attention_head_dim=8, norm_num_groups=4, num_class_embeds=5)

SMALL_VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                 up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
                 latent_channels=4, norm_num_groups=4, sample_size=16)

REFERENCE_UNET = dict(in_channels=4, out_channels=4, block_out_channels=(128, 256, 512),
                      down_block_types=("DownBlock2D",) * 3, up_block_types=("UpBlock2D",) * 3,
                      layers_per_block=2, attention_head_dim=64, norm_num_groups=32)


def perturbed(model: Any, seed: int = 0, scale: float = 0.1) -> Any:
    """A torch model in eval mode with every parameter moved off its initial value (norm
    weights away from 1, biases away from 0), so no term of the network is trivial."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * scale)
    return model.eval()


def diffusers_twin(kind: str, config: dict, folder: Path, double: bool = False, seed: int = 0) -> tuple[Any, Any]:
    """(diffusers model, ours) with the same random weights, passed through ``save_pretrained`` /
    ``from_pretrained``; ``double`` makes both sides float64."""
    import diffusers
    import torch

    torch.manual_seed(seed)
    theirs_cls, ours_cls = {"unet": (diffusers.UNet2DModel, UNet2D), "vae": (diffusers.AutoencoderKL, AutoencoderKL)}[kind]
    theirs = perturbed(theirs_cls(**config), seed)
    if double:
        theirs = theirs.double()
    theirs.save_pretrained(folder)
    return theirs, ours_cls.from_pretrained(folder, dtype=tc.float64 if double else None)


def as_numpy(t: Any) -> np.ndarray:
    """A torch or tensorcore tensor as a NumPy array."""
    if isinstance(t, np.ndarray):
        return t
    return t.numpy() if isinstance(t, tc.Tensor) else t.detach().cpu().numpy()


def assert_close(actual: Any, expected: Any, rel: float) -> None:
    """max |actual - expected| <= rel * max |expected| (a relative bound on the whole tensor)."""
    a, e = as_numpy(actual), as_numpy(expected)
    assert a.shape == e.shape, (a.shape, e.shape)
    err, scale = float(np.abs(a - e).max()), float(np.abs(e).max())
    assert err <= rel * scale, f"max error {err:.3g} exceeds {rel:g} x {scale:.3g}"


def randn(*shape: int, seed: int = 0, dtype: Any = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)
