"""Every scheduler's full sampling loop against diffusers' on a grid of configs (rtol 2e-4).

Both loops see the same start sample, the same deterministic model and, where a step
is stochastic, the same injected noise (diffusers' ``randn_tensor`` is replaced by the
injected noise where its ``step`` takes no ``variance_noise``).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

import diffusion
import tensorcore as tc
from scheduler_cases import sample_loop, smooth_model, start_sample, step_noises

diffusers = pytest.importorskip("diffusers")
torch = pytest.importorskip("torch")

# diffusers 0.42 hands torch tensors to np.array(..., copy=False): NumPy 2 warns about it
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")
PREDICTIONS = ("epsilon", "v_prediction", "sample")
SPACINGS = ("leading", "trailing", "linspace")
GRID = list(itertools.product(SCHEDULES, PREDICTIONS, SPACINGS, (0, 1), (7, 16)))
GRID_IDS = ["-".join(map(str, case)) for case in GRID]
SD15 = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear", "steps_offset": 1}
RTOL, ATOL = 2e-4, 1e-5

# module of each diffusers scheduler whose step draws noise without taking variance_noise
_NOISE_MODULES = {"DDPMScheduler": "scheduling_ddpm", "EulerDiscreteScheduler": "scheduling_euler_discrete",
                  "EulerAncestralDiscreteScheduler": "scheduling_euler_ancestral_discrete", "LCMScheduler": "scheduling_lcm"}


def diffusers_loop(name: str, config: dict[str, Any], steps: int, x: np.ndarray, noises: list[np.ndarray] | None,
                   step_kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, np.ndarray]:
    """diffusers' loop, with the same model and noise; returns (scheduler, final sample)."""
    scheduler = getattr(diffusers, name)(**config)
    scheduler.set_timesteps(steps)
    step = 0
    if name in _NOISE_MODULES:  # the noise of step k, whenever diffusers draws it
        module = getattr(diffusers.schedulers, _NOISE_MODULES[name])
        monkeypatch.setattr(module, "randn_tensor", lambda shape, **kw: torch.from_numpy(noises[step]))
    sample = torch.from_numpy(x) * scheduler.init_noise_sigma
    for step, t in enumerate(scheduler.timesteps):
        model_input = scheduler.scale_model_input(sample, t)
        output = torch.from_numpy(smooth_model(model_input.numpy(), float(t)))
        kwargs = dict(step_kwargs)
        if noises is not None and name not in _NOISE_MODULES:
            kwargs["variance_noise"] = torch.from_numpy(noises[step])
        sample = scheduler.step(output, t, sample, **kwargs).prev_sample
    return scheduler, sample.numpy()


def check_against_diffusers(name: str, config: dict[str, Any], steps: int, monkeypatch: pytest.MonkeyPatch,
                            noisy: bool = False, step_kwargs: dict[str, Any] | None = None) -> None:
    step_kwargs = step_kwargs or {}
    x = start_sample()
    noises = step_noises(steps) if noisy else None
    reference, expected = diffusers_loop(name, config, steps, x, noises, step_kwargs, monkeypatch)
    ours = getattr(diffusion, name)(**config)
    run = ours.start(steps)
    assert run.timesteps.dtype == np.dtype(str(reference.timesteps.dtype).replace("torch.", ""))
    # integer timesteps equal; fractional ones (Euler's) to float32 rounding of the betas
    np.testing.assert_allclose(run.timesteps.numpy(), reference.timesteps.numpy(), rtol=1e-6, atol=1e-6)
    if hasattr(reference, "sigmas"):
        np.testing.assert_allclose(run.sigmas.numpy(), reference.sigmas.numpy(), rtol=1e-6)
    np.testing.assert_allclose(run.init_noise_sigma, float(reference.init_noise_sigma), rtol=1e-6)
    got = sample_loop(run, x, noises, step_kwargs)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(expected).max())))


def grid_config(schedule: str, prediction: str, spacing: str, offset: int) -> dict[str, Any]:
    return {"beta_schedule": schedule, "prediction_type": prediction, "timestep_spacing": spacing,
            "steps_offset": offset}


@pytest.mark.parametrize("schedule,prediction,spacing,offset,steps", GRID, ids=GRID_IDS)
def test_ddim_grid(schedule, prediction, spacing, offset, steps, monkeypatch):
    eta = 0.5 if offset else 0.0  # half the grid stochastic, with injected noise
    check_against_diffusers("DDIMScheduler", grid_config(schedule, prediction, spacing, offset), steps,
                            monkeypatch, noisy=eta > 0, step_kwargs={"eta": eta})


@pytest.mark.parametrize("schedule,prediction,spacing,offset,steps", GRID, ids=GRID_IDS)
def test_ddpm_grid(schedule, prediction, spacing, offset, steps, monkeypatch):
    check_against_diffusers("DDPMScheduler", grid_config(schedule, prediction, spacing, offset), steps,
                            monkeypatch, noisy=True)


@pytest.mark.parametrize("schedule,prediction,spacing,offset,steps", GRID, ids=GRID_IDS)
def test_dpm_solver_grid(schedule, prediction, spacing, offset, steps, monkeypatch):
    check_against_diffusers("DPMSolverMultistepScheduler", grid_config(schedule, prediction, spacing, offset),
                            steps, monkeypatch)


@pytest.mark.parametrize("schedule,prediction,spacing,offset,steps", GRID, ids=GRID_IDS)
def test_euler_grid(schedule, prediction, spacing, offset, steps, monkeypatch):
    check_against_diffusers("EulerDiscreteScheduler", grid_config(schedule, prediction, spacing, offset), steps,
                            monkeypatch)


@pytest.mark.parametrize("config,eta", [
    ({"clip_sample": False, "set_alpha_to_one": False}, 1.0),
    ({"thresholding": True, "sample_max_value": 1.5, "clip_sample": False}, 0.0),
    ({"rescale_betas_zero_snr": True, "timestep_spacing": "trailing", "prediction_type": "v_prediction"}, 0.0),
    ({"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear", "clip_sample": False,
      "set_alpha_to_one": False, "steps_offset": 1}, 0.0),
    ({"trained_betas": np.linspace(1e-4, 0.02, 1000).tolist(), "clip_sample_range": 0.5}, 0.3),
])
def test_ddim_options(config, eta, monkeypatch):
    check_against_diffusers("DDIMScheduler", config, 12, monkeypatch, noisy=eta > 0,
                            step_kwargs={"eta": eta, "use_clipped_model_output": True})


@pytest.mark.parametrize("config", [
    {"variance_type": "fixed_small_log"},
    {"variance_type": "fixed_large"},
    {"beta_schedule": "sigmoid", "clip_sample": False},
    {"beta_schedule": "laplace"},
    {"thresholding": True, "dynamic_thresholding_ratio": 0.9},
    {"rescale_betas_zero_snr": True, "timestep_spacing": "trailing", "prediction_type": "v_prediction"},
])
def test_ddpm_options(config, monkeypatch):
    check_against_diffusers("DDPMScheduler", config, 10, monkeypatch, noisy=True)


@pytest.mark.parametrize("config,steps,noisy", [
    ({"solver_order": 1}, 10, False),
    ({"solver_order": 3}, 10, False),
    ({"solver_order": 3, "lower_order_final": False}, 20, False),
    ({"lower_order_final": False}, 10, False),
    ({"solver_type": "heun"}, 12, False),
    ({"use_karras_sigmas": True}, 12, False),
    ({"use_karras_sigmas": True, "beta_schedule": "scaled_linear", "timestep_spacing": "leading"}, 20, False),
    ({"use_exponential_sigmas": True}, 12, False),
    ({"use_lu_lambdas": True}, 12, False),
    ({"final_sigmas_type": "sigma_min", "euler_at_final": True}, 10, False),
    ({"final_sigmas_type": "sigma_min"}, 10, False),
    ({"thresholding": True, "prediction_type": "sample"}, 10, False),
    ({"lambda_min_clipped": -5.1, "beta_schedule": "squaredcos_cap_v2"}, 10, False),
    ({"rescale_betas_zero_snr": True, "timestep_spacing": "trailing", "prediction_type": "v_prediction"}, 10, False),
    ({"algorithm_type": "sde-dpmsolver++"}, 10, True),
    ({"algorithm_type": "sde-dpmsolver++", "solver_type": "heun"}, 10, True),
    ({"algorithm_type": "sde-dpmsolver++", "solver_order": 3}, 16, True),
])
def test_dpm_solver_options(config, steps, noisy, monkeypatch):
    check_against_diffusers("DPMSolverMultistepScheduler", config, steps, monkeypatch, noisy=noisy)


@pytest.mark.parametrize("config,step_kwargs", [
    ({"use_karras_sigmas": True}, {}),
    ({"use_karras_sigmas": True, "sigma_min": 0.1, "sigma_max": 10.0, "timestep_spacing": "leading"}, {}),
    ({"use_exponential_sigmas": True}, {}),
    ({"interpolation_type": "log_linear"}, {}),
    ({"final_sigmas_type": "sigma_min"}, {}),
    ({"timestep_type": "continuous", "prediction_type": "v_prediction"}, {}),
    ({"rescale_betas_zero_snr": True, "timestep_spacing": "trailing", "prediction_type": "v_prediction"}, {}),
    ({"beta_schedule": "scaled_linear"}, {"s_churn": 1.0, "s_tmin": 0.1, "s_tmax": 50.0}),
])
def test_euler_options(config, step_kwargs, monkeypatch):
    check_against_diffusers("EulerDiscreteScheduler", config, 12, monkeypatch,
                            noisy="s_churn" in step_kwargs, step_kwargs=step_kwargs)


@pytest.mark.parametrize("name", ["DDPMScheduler", "DDIMScheduler", "DPMSolverMultistepScheduler",
                                  "EulerDiscreteScheduler"])
@pytest.mark.parametrize("config", [{"beta_schedule": "linear"}, {"beta_schedule": "scaled_linear"},
                                    {"beta_schedule": "squaredcos_cap_v2", "rescale_betas_zero_snr": True}])
def test_tables_match_diffusers(name, config):
    ours, theirs = getattr(diffusion, name)(**config), getattr(diffusers, name)(**config)
    # (rescaled betas are 1 - α with α ≈ 1: they differ by float32 ulps of 1)
    np.testing.assert_allclose(ours.betas.numpy(), theirs.betas.numpy(), rtol=1e-6, atol=5e-7)
    np.testing.assert_allclose(ours.alphas_cumprod.numpy(), theirs.alphas_cumprod.numpy(), rtol=2e-6, atol=1e-9)
    np.testing.assert_array_equal(ours.timesteps.numpy(), theirs.timesteps.numpy().astype(ours.timesteps.dtype))
    if hasattr(theirs, "sigmas"):  # σ before set_timesteps (DPM keeps them ascending, Euler descending + 0)
        # small σ = sqrt((1 - ᾱ) / ᾱ) inherit ᾱ's ulps of 1 (torch's float32 sqrt is not correctly rounded)
        np.testing.assert_allclose(ours.sigmas.numpy(), theirs.sigmas.numpy(), rtol=2e-6, atol=1e-5)
    assert ours.init_noise_sigma == pytest.approx(float(theirs.init_noise_sigma), rel=1e-6)


@pytest.mark.parametrize("name,config", [("DPMSolverMultistepScheduler", {}),
                                         ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),
                                         ("EulerDiscreteScheduler", {"use_karras_sigmas": True}),
                                         ("DDIMScheduler", {"clip_sample": False}),
                                         ("PNDMScheduler", {**SD15, "skip_prk_steps": True}),
                                         ("UniPCMultistepScheduler", {}),
                                         ("UniPCMultistepScheduler", {"use_karras_sigmas": True, "solver_order": 3})])
def test_image_to_image_start_matches_diffusers(name, config):
    """Start at step 4 of 10 from a noised image: diffusers' set_begin_index + add_noise (PNDM,
    which has no set_begin_index there, warms up its multistep again from the sliced timesteps)."""
    x0, noise = start_sample(seed=3), step_noises(1, seed=4)[0]
    theirs = getattr(diffusers, name)(**config)
    theirs.set_timesteps(10)
    if hasattr(theirs, "set_begin_index"):
        theirs.set_begin_index(4)
    sample = theirs.add_noise(torch.from_numpy(x0), torch.from_numpy(noise), theirs.timesteps[4:5])
    for t in theirs.timesteps[4:]:
        output = torch.from_numpy(smooth_model(theirs.scale_model_input(sample, t).numpy(), float(t)))
        sample = theirs.step(output, t, sample).prev_sample
    run = getattr(diffusion, name)(**config).start(10)
    run.set_begin_index(4)
    ours = run.add_noise(tc.tensor(x0), tc.tensor(noise))
    for t in run.timesteps[4:]:
        output = tc.tensor(smooth_model(run.scale_model_input(ours, t).numpy(), float(t)))
        ours = run.step(output, t, ours).prev_sample
    assert run.finished
    np.testing.assert_allclose(ours.numpy(), sample.numpy(), rtol=RTOL, atol=ATOL)


def test_ddpm_without_set_timesteps_matches_diffusers(monkeypatch):
    x, noises = start_sample(), step_noises(5)
    theirs = diffusers.DDPMScheduler()
    step = 0
    monkeypatch.setattr(diffusers.schedulers.scheduling_ddpm, "randn_tensor",
                        lambda shape, **kw: torch.from_numpy(noises[step]))
    ours = diffusion.DDPMScheduler()
    expected, got = torch.from_numpy(x), tc.tensor(x)
    for step, t in enumerate(range(999, 994, -1)):
        expected = theirs.step(torch.from_numpy(smooth_model(expected.numpy(), t)), t, expected).prev_sample
        got = ours.step(tc.tensor(smooth_model(got.numpy(), t)), t, got, variance_noise=tc.tensor(noises[step])).prev_sample
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=RTOL, atol=ATOL)


def test_diffusers_runs_off_the_end_where_ours_finishes():
    """DPM-Solver++ with Karras σ on the cosine schedule repeats timesteps (7 steps -> 998 three times)."""
    config = {"beta_schedule": "squaredcos_cap_v2", "use_karras_sigmas": True}
    theirs = diffusers.DPMSolverMultistepScheduler(**config)
    theirs.set_timesteps(7)
    sample = torch.from_numpy(start_sample())
    with pytest.raises(IndexError):  # its step index searches the timestep list and overshoots
        for t in theirs.timesteps:
            sample = theirs.step(sample * 0.5, t, sample).prev_sample
    run = diffusion.DPMSolverMultistepScheduler(**config).start(7)
    assert run.timesteps.tolist() == theirs.timesteps.tolist()
    result = sample_loop(run, start_sample(), None, {})
    assert run.finished and np.all(np.isfinite(result))


@pytest.mark.parametrize("name,config", [("DDPMScheduler", {"variance_type": "learned_range"}),
                                         ("DDPMScheduler", {"variance_type": "learned"}),
                                         ("DPMSolverMultistepScheduler", {"variance_type": "learned_range"})])
def test_learned_variance_outputs_match_diffusers(name, config, monkeypatch):
    """The model output holds 2 x 3 channels (ε, then the variance), as in guided diffusion."""
    x, noises = start_sample(), step_noises(8)

    def model(sample: np.ndarray, t: float) -> np.ndarray:
        return np.concatenate([smooth_model(sample, t), 0.5 * np.tanh(sample) + 0.5], axis=1)

    theirs = getattr(diffusers, name)(**config)
    theirs.set_timesteps(8)
    step = 0
    monkeypatch.setattr(diffusers.schedulers.scheduling_ddpm, "randn_tensor",
                        lambda shape, **kw: torch.from_numpy(noises[step]))
    expected = torch.from_numpy(x)
    for step, t in enumerate(theirs.timesteps):
        expected = theirs.step(torch.from_numpy(model(expected.numpy(), float(t))), t, expected).prev_sample
    run = getattr(diffusion, name)(**config).start(8)
    got = tc.tensor(x)
    for step, t in enumerate(run.timesteps):
        kwargs = {"variance_noise": tc.tensor(noises[step])} if name == "DDPMScheduler" else {}
        got = run.step(tc.tensor(model(got.numpy(), float(t))), t, got, **kwargs).prev_sample
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=RTOL, atol=ATOL)
