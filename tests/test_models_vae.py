"""AutoencoderKL against diffusers' AutoencoderKL on the same weights, the posterior, and slicing."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcore as tc
from diffusion import AutoencoderKL
from diffusion.models import DiagonalGaussianDistribution
from models_oracle import SMALL_VAE, assert_close, diffusers_twin, randn

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


def compare(theirs, ours, x, rel, dtype=np.float32) -> None:
    with torch.no_grad():
        posterior = theirs.encode(torch.tensor(x)).latent_dist
        decoded = theirs.decode(posterior.mean).sample
        reconstruction = theirs(torch.tensor(x)).sample
    with tc.no_grad():
        ours_posterior = ours.encode(tc.tensor(x, dtype=dtype))
        assert_close(ours_posterior.mean, posterior.mean, rel)
        assert_close(ours_posterior.logvar, posterior.logvar, rel)
        assert_close(ours_posterior.std, posterior.std, rel)
        assert_close(ours_posterior.kl(), posterior.kl(), rel)
        assert_close(ours.decode(tc.tensor(posterior.mean.numpy(), dtype=dtype)), decoded, rel)
        assert_close(ours(tc.tensor(x, dtype=dtype)), reconstruction, rel)


def test_small_vae_matches_diffusers_float32(backend, tmp_path) -> None:
    theirs, ours = diffusers_twin("vae", SMALL_VAE, tmp_path)
    compare(theirs, ours, randn(2, 3, 16, 16), 1e-4)


VARIANTS = {
    "attention_blocks+gelu": dict(down_block_types=("DownEncoderBlock2D", "AttnDownEncoderBlock2D"),
                                  up_block_types=("AttnUpDecoderBlock2D", "UpDecoderBlock2D"), act_fn="gelu"),
    "no_mid_attention+no_quant_convs": dict(mid_block_add_attention=False, use_quant_conv=False,
                                            use_post_quant_conv=False, layers_per_block=2, latent_channels=2),
}


@pytest.mark.parametrize("variant", [None, *VARIANTS])
def test_vae_matches_diffusers_float64(variant, tmp_path) -> None:
    theirs, ours = diffusers_twin("vae", {**SMALL_VAE, **VARIANTS.get(variant, {})}, tmp_path, double=True)
    compare(theirs, ours, randn(2, 3, 12, 10, dtype=np.float64), 1e-11, np.float64)  # odd sizes halve as diffusers'


def test_posterior_statistics() -> None:
    moments = randn(2, 8, 3, 3, dtype=np.float64) * 20.0  # log-variances far outside [-30, 20] get clamped
    posterior = DiagonalGaussianDistribution(tc.tensor(moments))
    mean, logvar = moments[:, :4], np.clip(moments[:, 4:], -30.0, 20.0)
    np.testing.assert_array_equal(posterior.mean.numpy(), mean)
    np.testing.assert_array_equal(posterior.logvar.numpy(), logvar)
    np.testing.assert_allclose(posterior.std.numpy(), np.exp(0.5 * logvar), rtol=1e-14)
    np.testing.assert_allclose(posterior.var.numpy(), np.exp(logvar), rtol=1e-14)
    np.testing.assert_array_equal(posterior.mode().numpy(), mean)
    kl = 0.5 * (mean ** 2 + np.exp(logvar) - 1.0 - logvar).sum(axis=(1, 2, 3))
    np.testing.assert_allclose(posterior.kl().numpy(), kl, rtol=1e-12)
    np.testing.assert_allclose(posterior.kl(posterior).numpy(), 0.0, atol=1e-9)
    sample = tc.tensor(randn(2, 4, 3, 3, seed=1, dtype=np.float64))
    nll = 0.5 * (np.log(2 * np.pi) + logvar + (sample.numpy() - mean) ** 2 / np.exp(logvar)).sum(axis=(1, 2, 3))
    np.testing.assert_allclose(posterior.nll(sample).numpy(), nll, rtol=1e-12)
    # sample(generator): mean + std * the generator's next normal draws
    draws = tc.randn(2, 4, 3, 3, dtype=tc.float64, generator=tc.Generator(seed=7)).numpy()
    drawn = posterior.sample(tc.Generator(seed=7)).numpy()
    np.testing.assert_allclose(drawn, mean + np.exp(0.5 * logvar) * draws, rtol=1e-14)
    point = DiagonalGaussianDistribution(tc.tensor(moments), deterministic=True)
    np.testing.assert_array_equal(point.sample().numpy(), mean)
    np.testing.assert_array_equal(point.kl().numpy(), np.zeros(2))


def test_sample_posterior_draws_around_the_mode() -> None:
    vae = AutoencoderKL(**SMALL_VAE).eval()
    x = tc.tensor(randn(1, 3, 16, 16))
    with tc.no_grad():
        a = vae(x, sample_posterior=True, generator=tc.Generator(seed=1)).numpy()
        b = vae(x, sample_posterior=True, generator=tc.Generator(seed=1)).numpy()
        c = vae(x, sample_posterior=True, generator=tc.Generator(seed=2)).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_slicing_runs_one_sample_at_a_time(backend) -> None:
    vae = AutoencoderKL(**SMALL_VAE).eval()
    x = tc.tensor(randn(3, 3, 16, 16))
    with tc.no_grad():
        moments, decoded = vae.encode(x).parameters.numpy(), vae.decode(vae.encode(x).mean).numpy()
        one_by_one = np.concatenate([vae.encode(x[i:i + 1]).parameters.numpy() for i in range(3)])
        decoded_one_by_one = np.concatenate([vae.decode(vae.encode(x[i:i + 1]).mean).numpy() for i in range(3)])
        version = vae.structure_version
        vae.enable_slicing()
        assert vae.use_slicing and vae.structure_version != version
        sliced = vae.encode(x).parameters.numpy()
        sliced_decoded = vae.decode(vae.encode(x).mean).numpy()
        version = vae.structure_version
        vae.enable_slicing()  # no change, no new version
        assert vae.structure_version == version
        vae.disable_slicing()
        assert not vae.use_slicing and vae.structure_version != version
    np.testing.assert_array_equal(sliced, one_by_one)
    np.testing.assert_array_equal(sliced_decoded, decoded_one_by_one)
    # BLAS may pick another kernel for a batch's wider GEMM than for one sample's: equal up to float32 rounding
    assert_close(sliced, moments, 1e-5)
    assert_close(sliced_decoded, decoded, 1e-5)


def test_bad_inputs_and_configs_raise() -> None:
    vae = AutoencoderKL(**SMALL_VAE)
    with pytest.raises(ValueError, match=r"encode: expected \[B, 3, H, W\]"):
        vae.encode(tc.tensor(randn(1, 4, 8, 8)))
    with pytest.raises(ValueError, match=r"decode: expected \[B, 4, H, W\]"):
        vae.decode(tc.tensor(randn(1, 3, 8, 8)))
    with pytest.raises(ValueError, match="not supported"):
        AutoencoderKL(**{**SMALL_VAE, "down_block_types": ("DownBlock2D",) * 2})
    with pytest.raises(ValueError, match="same positive length"):
        AutoencoderKL(**{**SMALL_VAE, "block_out_channels": (8, 16, 16)})
    with pytest.raises(ValueError, match="moments"):
        DiagonalGaussianDistribution(tc.tensor(randn(1, 3, 2, 2)))


def test_a_zero_scaling_factor_is_refused_when_the_vae_is_built(tmp_path) -> None:
    with pytest.raises(ValueError, match="scaling_factor must be a non-zero number, got 0"):
        AutoencoderKL(**SMALL_VAE, scaling_factor=0)
    AutoencoderKL(**SMALL_VAE).save_pretrained(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(config.read_text().replace('"scaling_factor": 0.18215', '"scaling_factor": 0.0'))
    with pytest.raises(ValueError, match="scaling_factor"):
        AutoencoderKL.from_pretrained(tmp_path)
