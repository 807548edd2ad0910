"""VAE tiling: the same tiles and blends as diffusers, seams without steps, a tiled decode
close to the untiled one, gradients through the blend, and the switches."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcore as tc
import tensorcore.functional as F
from diffusion import AutoencoderKL
from diffusion.models import tiling
from diffusion.models.tiling import blend, tiled_apply
from models_oracle import SMALL_VAE, assert_close, diffusers_twin, randn


def test_blend_is_a_linear_ramp_over_the_overlap() -> None:
    before, after = tc.tensor(np.full((1, 1, 6, 2), 10.0)), tc.tensor(np.zeros((1, 1, 5, 2)))
    out = blend(before, after, 4, axis=2).numpy()[0, 0, :, 0]
    np.testing.assert_allclose(out, [10.0, 7.5, 5.0, 2.5, 0.0])
    assert blend(before, after, 0, axis=2) is after
    np.testing.assert_allclose(blend(before[:, :, :2], after, 4, axis=2).numpy()[0, 0, :, 0], [10, 5, 0, 0, 0])


@pytest.mark.parametrize("shape", [(1, 4, 12, 12), (2, 4, 10, 7)])
def test_tiled_decode_matches_diffusers(shape, tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    theirs, ours = diffusers_twin("vae", SMALL_VAE, tmp_path)  # sample_size 16: 8x8 latent tiles
    theirs.enable_tiling()
    ours.enable_tiling()
    z = randn(*shape)
    with torch.no_grad():
        expected = theirs.decode(torch.tensor(z)).sample
    with tc.no_grad():
        assert_close(ours.decode(tc.tensor(z)), expected, 1e-4)


def test_tiled_encode_matches_diffusers(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    theirs, ours = diffusers_twin("vae", SMALL_VAE, tmp_path)
    theirs.enable_tiling()
    ours.enable_tiling()
    x = randn(1, 3, 28, 36)
    with torch.no_grad():
        expected = theirs.encode(torch.tensor(x)).latent_dist
    with tc.no_grad():
        posterior = ours.encode(tc.tensor(x))
        assert_close(posterior.mean, expected.mean, 1e-4)
        assert_close(posterior.logvar, expected.logvar, 1e-4)
        assert_close(ours.tiled_encode(tc.tensor(x)).mean, expected.mean, 1e-4)


def smooth_vae(seed: int = 0) -> AutoencoderKL:
    """A VAE decoder close to a smooth, local map: every 3x3 kernel a channel mix of one blur
    kernel, residual branches weak, no global attention, so a smooth latent decodes to a
    smooth image and a seam step would stand out."""
    vae = AutoencoderKL(**{**SMALL_VAE, "mid_block_add_attention": False}).eval()
    rng = np.random.default_rng(seed)
    blur = np.outer([1, 2, 1], [1, 2, 1]) / 16
    with tc.no_grad():
        for name, p in vae.named_parameters():
            if p.ndim == 4:
                mix = rng.standard_normal(p.shape[:2]) / np.sqrt(p.shape[1])
                mix *= 0.05 if name.endswith("conv2.weight") else 1.0
                p.copy_(tc.tensor(mix[:, :, None, None] * (blur if p.shape[2] == 3 else 1.0), dtype=p.dtype))
            elif "norm" not in name:  # biases
                p.copy_(tc.tensor(rng.standard_normal(p.shape) * 0.1, dtype=p.dtype))
    return vae


def seam_report(tiled: np.ndarray, full: np.ndarray, seams: list[int], axis: int) -> tuple[float, float]:
    """(largest jump of the tiling error across a seam, largest jump between two rows inside tiles)."""
    jumps = np.abs(np.diff(tiled - full, axis=axis)).max(axis=tuple(a for a in range(4) if a != axis))
    at_seams = [jumps[s - 1] for s in seams]
    return max(at_seams), np.delete(jumps, [s - 1 for s in seams]).max()


def test_tiled_decode_of_a_smooth_latent_has_no_seams(monkeypatch) -> None:
    vae = smooth_vae()
    n = 24
    y, x = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    z = tc.tensor(np.stack([np.sin(2 * np.pi * y / 12 + c) * np.cos(2 * np.pi * x / 12 - c) for c in range(4)])[None],
                  dtype=tc.float32)
    with tc.no_grad():
        full = vae.decode(z).numpy()
        vae.enable_tiling(32, 0.25)  # 16-pixel latent tiles every 12, blended over 8 image rows; 24 kept per tile
        tiled = vae.decode(z).numpy()
        monkeypatch.setattr(tiling, "blend", lambda before, after, extent, axis: after)
        unblended = vae.decode(z).numpy()
    assert np.abs(tiled - full).max() <= 0.15 * np.abs(full).max()
    assert np.abs(tiled - full).mean() <= 0.1 * np.abs(full).mean()
    for axis in (2, 3):
        at_seam, inside = seam_report(tiled, full, [24], axis)
        assert at_seam <= 0.75 * inside, (axis, at_seam, inside)
        at_seam, inside = seam_report(unblended, full, [24], axis)
        assert at_seam > 1.25 * inside, (axis, at_seam, inside)  # the check sees a seam when there is one


def test_gradients_flow_through_blended_tiles() -> None:
    rng = np.random.default_rng(0)
    weight = tc.tensor(rng.standard_normal((2, 2, 3, 3)))

    def fn(tile):  # a 2x "decoder" with zero-padding edge effects
        return F.conv2d(F.interpolate(tile, scale_factor=2), weight, padding=1)

    x = tc.tensor(rng.standard_normal((1, 2, 7, 9)), requires_grad=True)
    cotangent = rng.standard_normal((1, 2, 14, 18))
    (tiled_apply(x, fn, 4, 8, 0.25) * tc.tensor(cotangent)).sum().backward()
    base = x.detach().numpy()
    for index in [(0, 0, 0, 0), (0, 1, 2, 3), (0, 0, 3, 4), (0, 1, 6, 8), (0, 0, 4, 2)]:
        plus, minus = base.copy(), base.copy()
        plus[index] += 1e-6
        minus[index] -= 1e-6
        with tc.no_grad():
            numeric = ((tiled_apply(tc.tensor(plus), fn, 4, 8, 0.25).numpy()
                        - tiled_apply(tc.tensor(minus), fn, 4, 8, 0.25).numpy()) * cotangent).sum() / 2e-6
        np.testing.assert_allclose(x.grad.numpy()[index], numeric, rtol=1e-6, atol=1e-8)


def test_tiling_switches_and_arguments() -> None:
    vae = AutoencoderKL(**SMALL_VAE)
    assert not vae.use_tiling and vae.tile_sample_min_size == 16 and vae.tile_latent_min_size == 8
    version = vae.structure_version
    vae.enable_tiling()
    assert vae.use_tiling and vae.tile_overlap_factor == 0.25 and vae.structure_version != version
    version = vae.structure_version
    vae.enable_tiling(32, 0.5)
    assert (vae.tile_sample_min_size, vae.tile_latent_min_size, vae.tile_overlap_factor) == (32, 16, 0.5)
    assert vae.structure_version != version
    version = vae.structure_version
    vae.enable_tiling(32, 0.5)
    assert vae.structure_version == version
    vae.disable_tiling()
    assert not vae.use_tiling and vae.structure_version != version
    with pytest.raises(ValueError, match="multiple of 2"):
        vae.enable_tiling(15)
    with pytest.raises(ValueError, match=r"tile_overlap_factor must be in \[0, 1\)"):
        vae.enable_tiling(16, 1.0)
    assert not vae.use_tiling
    with pytest.raises(ValueError, match="leaves no stride"):
        tiled_apply(tc.zeros(1, 1, 4, 4), lambda t: t, 2, 2, 0.9)
