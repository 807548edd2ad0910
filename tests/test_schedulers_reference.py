"""diffusers' own reference numbers for the schedulers, and the identities a scheduler must keep."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcore as tc
from diffusion import DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler
from scheduler_cases import REFERENCE_CONFIG, deterministic_sample, dummy_model


def ddim_full_loop(**overrides) -> tc.Tensor:
    """diffusers' DDIM ``full_loop``: 10 steps, eta 0, the dummy model on the deterministic sample."""
    scheduler = DDIMScheduler(**{**REFERENCE_CONFIG, **overrides})
    scheduler.set_timesteps(10)
    sample = deterministic_sample()
    for t in scheduler.timesteps:
        sample = scheduler.step(dummy_model(sample, t), t, sample, 0.0).prev_sample
    return sample


@pytest.mark.parametrize("overrides,total,mean,mean_digits", [
    ({}, 172.0067, 0.223967, 6),
    ({"prediction_type": "v_prediction"}, 52.5302, 0.0684, 4),
    ({"set_alpha_to_one": True, "beta_start": 0.01}, 149.8295, 0.1951, 4),
    ({"set_alpha_to_one": False, "beta_start": 0.01}, 149.0784, 0.1941, 4),
])
def test_ddim_full_loop_reference(overrides, total, mean, mean_digits):
    sample = ddim_full_loop(**overrides).abs()
    assert sample.sum().item() == pytest.approx(total, rel=1e-6)
    assert sample.mean().item() == pytest.approx(mean, abs=0.5 * 10.0 ** -mean_digits)


def test_ddim_timesteps_reference():
    scheduler = DDIMScheduler(steps_offset=1)
    scheduler.set_timesteps(5)
    assert scheduler.timesteps.tolist() == [801, 601, 401, 201, 1]
    assert scheduler.timesteps.dtype == np.int64
    run = DDIMScheduler(timestep_spacing="trailing").start(13)
    assert run.timesteps.tolist() == [999, 922, 845, 768, 691, 614, 537, 461, 384, 307, 230, 153, 76]


@pytest.mark.parametrize("t,prev,expected", [(420, 400, 0.14771), (980, 960, 0.32460),
                                              (487, 486, 0.00979), (999, 998, 0.02)])
def test_ddim_variance_reference(t, prev, expected):
    assert DDIMScheduler(**REFERENCE_CONFIG)._get_variance(t, prev).item() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("t,expected", [(0, 0.0), (487, 0.00979), (999, 0.02)])
def test_ddpm_fixed_small_variance_reference(t, expected):
    scheduler = DDPMScheduler(**REFERENCE_CONFIG, variance_type="fixed_small")
    assert scheduler._get_variance(t).item() == pytest.approx(expected, abs=1e-5)


def test_beta_tables_reference():
    # 0.2776697 is the exact (float64) ᾱ_499; float32 tables (diffusers' too) hold 0.2776694
    scaled = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
    assert scaled.alphas_cumprod[499].item() == pytest.approx(0.2776697, rel=2e-6)
    cosine = DDPMScheduler(beta_schedule="squaredcos_cap_v2")
    assert cosine.betas[0].item() == pytest.approx(4.128422e-5, rel=1e-6)
    assert scaled.alphas_cumprod.dtype == np.float32


# ----- identities ------------------------------------------------------------------------------
SAMPLERS = [DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler]


def clean_and_noise(shape=(2, 3, 4, 4), dtype=np.float64) -> tuple[tc.Tensor, tc.Tensor]:
    rng = np.random.default_rng(7)
    return tc.tensor(rng.uniform(-1, 1, shape).astype(dtype)), tc.tensor(rng.standard_normal(shape).astype(dtype))


def perfect_output(scheduler, prediction_type: str, x0: tc.Tensor, noise: tc.Tensor, t) -> tc.Tensor:
    """What an exact model predicts for x_t = add_noise(x0, noise, t)."""
    if prediction_type == "epsilon":
        return noise
    if prediction_type == "sample":
        return x0
    return scheduler.get_velocity(x0, noise, tc.tensor([t] * x0.shape[0]))


@pytest.mark.parametrize("cls", SAMPLERS + [EulerDiscreteScheduler])
@pytest.mark.parametrize("prediction_type", ["epsilon", "sample", "v_prediction"])
def test_original_sample_recovered_after_add_noise(cls, prediction_type):
    options = {} if cls in (DPMSolverMultistepScheduler, EulerDiscreteScheduler) else {"clip_sample": False}
    scheduler = cls(prediction_type=prediction_type, **options)
    x0, noise = clean_and_noise()
    for position in (0, 4, 9):
        run = scheduler.start(10)
        run.set_begin_index(position)
        t = run.timestep_at(position)
        noisy = scheduler.add_noise(x0, noise, tc.tensor([t, t]))
        output = perfect_output(scheduler, prediction_type, x0, noise, t)
        run.scale_model_input(noisy, t)  # (the exact model needs no input)
        step = run.step(output, t, noisy)
        # Euler steps in float32 (as diffusers): x0 = x - σ ε cancels at σ ≈ 157
        atol = 1e-4 if cls is EulerDiscreteScheduler else 1e-5
        np.testing.assert_allclose(step.pred_original_sample.numpy(), x0.numpy(), rtol=1e-5, atol=atol)


@pytest.mark.parametrize("cls", SAMPLERS + [EulerDiscreteScheduler])
def test_velocity_round_trip(cls):
    scheduler = cls()
    x0, noise = clean_and_noise()
    t = tc.tensor([37, 980])
    alpha_bar = scheduler.alphas_cumprod.numpy().astype(np.float64)[[37, 980]].reshape(-1, 1, 1, 1)
    a, s = np.sqrt(alpha_bar), np.sqrt(1 - alpha_bar)
    v = scheduler.get_velocity(x0, noise, t).numpy()
    np.testing.assert_allclose(v, a * noise.numpy() - s * x0.numpy(), rtol=1e-6, atol=1e-6)
    # x_t and v determine x0 and ε again: [x0, ε] = [[a, -s], [s, a]] [x_t, v]
    x_t = a * x0.numpy() + s * noise.numpy()
    np.testing.assert_allclose(a * x_t - s * v, x0.numpy(), atol=1e-6)
    np.testing.assert_allclose(s * x_t + a * v, noise.numpy(), atol=1e-6)


def test_add_noise_broadcasts_timesteps_over_the_batch():
    scheduler = DDPMScheduler()
    x0, noise = clean_and_noise()
    one = scheduler.add_noise(x0, noise, 500).numpy()
    each = scheduler.add_noise(x0, noise, tc.tensor([500, 500])).numpy()
    alpha_bar = float(scheduler.alphas_cumprod[500].item())
    np.testing.assert_allclose(one, np.sqrt(alpha_bar) * x0.numpy() + np.sqrt(1 - alpha_bar) * noise.numpy(),
                               rtol=1e-7)
    np.testing.assert_array_equal(one, each)


def test_ddim_eta_one_follows_sigma_formula():
    scheduler = DDIMScheduler(clip_sample=False)
    run, quiet = scheduler.start(10), scheduler.start(10)
    x0, noise = clean_and_noise()
    z = tc.tensor(np.random.default_rng(3).standard_normal(x0.shape))
    t = run.timestep_at(0)
    prev = t - 1000 // 10
    x_t = scheduler.add_noise(x0, noise, t)
    out = run.step(noise, t, x_t, eta=1.0, variance_noise=z).prev_sample.numpy()
    alpha_bar = scheduler.alphas_cumprod.numpy().astype(np.float64)
    a_t, a_prev = alpha_bar[t], alpha_bar[prev]
    sigma = np.sqrt((1 - a_prev) / (1 - a_t)) * np.sqrt(1 - a_t / a_prev)  # DDIM eq. (16), eta = 1
    original = (x_t.numpy() - np.sqrt(1 - a_t) * noise.numpy()) / np.sqrt(a_t)
    expected = np.sqrt(a_prev) * original + np.sqrt(1 - a_prev - sigma ** 2) * noise.numpy() + sigma * z.numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    # the noise enters as σ_t z on top of the eta = 1 mean
    mean = quiet.step(noise, t, x_t, eta=1.0, variance_noise=tc.zeros_like(z)).prev_sample.numpy()
    np.testing.assert_allclose(out - mean, sigma * z.numpy(), rtol=1e-5, atol=1e-7)
