"""The schedulers Stable Diffusion folders name -- PNDM, Euler ancestral, LCM, UniPC -- against
diffusers: timesteps, full sampling loops (the same injected noise where a step draws it),
scheduler_config.json loading by class name, independent runs and refused configs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import diffusion
import tensorcore as tc
from diffusion.pipelines.pretrained import SCHEDULERS
from scheduler_cases import sample_loop, smooth_model, start_sample, step_noises
from test_schedulers_diffusers import check_against_diffusers

diffusers = pytest.importorskip("diffusers")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

NAMES = ("PNDMScheduler", "EulerAncestralDiscreteScheduler", "LCMScheduler", "UniPCMultistepScheduler")
NOISY = ("EulerAncestralDiscreteScheduler", "LCMScheduler")
SD = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear", "steps_offset": 1}


def _cases(*axes: tuple) -> list[tuple]:
    """Each value of every axis at least once, cycling the shorter axes (a covering, not a product)."""
    size = max(len(axis) for axis in axes)
    return [tuple(axis[i % len(axis)] for axis in axes) for i in range(size)]


@pytest.mark.parametrize("skip,spacing,prediction,steps", [
    *_cases((True, False), ("leading", "trailing", "linspace"), ("epsilon", "v_prediction"), (4, 7, 16)),
    (False, "linspace", "v_prediction", 16), (True, "leading", "epsilon", 1), (True, "trailing", "epsilon", 2)])
def test_pndm_matches_diffusers(skip, spacing, prediction, steps, monkeypatch):
    config = {**SD, "skip_prk_steps": skip, "timestep_spacing": spacing, "prediction_type": prediction}
    check_against_diffusers("PNDMScheduler", config, steps, monkeypatch)


def test_pndm_sd1_config_and_set_alpha_to_one(monkeypatch):
    sd1 = {**SD, "skip_prk_steps": True, "set_alpha_to_one": False, "clip_sample": False}
    check_against_diffusers("PNDMScheduler", {k: v for k, v in sd1.items() if k != "clip_sample"}, 50, monkeypatch)
    check_against_diffusers("PNDMScheduler", {"set_alpha_to_one": True, "beta_schedule": "squaredcos_cap_v2"}, 10,
                            monkeypatch)


@pytest.mark.parametrize("schedule,spacing,prediction,offset", _cases(
    ("linear", "scaled_linear", "squaredcos_cap_v2"), ("leading", "trailing", "linspace"), ("epsilon", "v_prediction"),
    (0, 1)))
def test_euler_ancestral_matches_diffusers(schedule, spacing, prediction, offset, monkeypatch):
    config = {"beta_schedule": schedule, "timestep_spacing": spacing, "prediction_type": prediction,
              "steps_offset": offset}
    check_against_diffusers("EulerAncestralDiscreteScheduler", config, 9, monkeypatch, noisy=True)


def test_euler_ancestral_zero_terminal_snr(monkeypatch):
    config = {"rescale_betas_zero_snr": True, "timestep_spacing": "trailing", "prediction_type": "v_prediction"}
    check_against_diffusers("EulerAncestralDiscreteScheduler", config, 6, monkeypatch, noisy=True)


@pytest.mark.parametrize("config,steps", [
    ({}, 4), ({"prediction_type": "v_prediction", "set_alpha_to_one": False}, 8), ({"prediction_type": "sample"}, 1),
    ({"original_inference_steps": 100, "timestep_scaling": 5.0, "beta_schedule": "linear"}, 6),
    ({"clip_sample": True, "clip_sample_range": 0.8, "prediction_type": "sample"}, 4),
    ({"thresholding": True, "prediction_type": "sample", "sample_max_value": 1.5}, 3)])
def test_lcm_matches_diffusers(config, steps, monkeypatch):
    check_against_diffusers("LCMScheduler", config, steps, monkeypatch, noisy=True)


@pytest.mark.parametrize("config,steps", [
    *[({"solver_order": order, "prediction_type": prediction, "timestep_spacing": spacing}, steps)
      for (order, prediction), spacing, steps in zip(
          itertools.product((1, 2, 3), ("epsilon", "v_prediction", "sample")),
          itertools.cycle(("linspace", "leading", "trailing")), itertools.cycle((5, 12, 7, 16)))],
    # bh1's and predict_x0=False's last step to σ = 0 are NaN in diffusers (0 * inf): with sigma_min here
    ({"solver_type": "bh1", "final_sigmas_type": "sigma_min", "solver_order": 3}, 10),
    ({"predict_x0": False, "final_sigmas_type": "sigma_min"}, 10),
    ({"predict_x0": False, "final_sigmas_type": "sigma_min", "solver_order": 3, "prediction_type": "v_prediction"}, 7),
    ({"solver_order": 3, "lower_order_final": False, "final_sigmas_type": "sigma_min"}, 12),
    ({"disable_corrector": [0, 3]}, 8),
    ({**SD, "use_karras_sigmas": True}, 10),
    ({"use_exponential_sigmas": True, "timestep_spacing": "trailing"}, 10),
    ({"thresholding": True, "prediction_type": "sample", "sample_max_value": 1.2}, 8),
    ({"rescale_betas_zero_snr": True, "timestep_spacing": "trailing", "prediction_type": "v_prediction"}, 8),
])
def test_unipc_matches_diffusers(config, steps, monkeypatch):
    check_against_diffusers("UniPCMultistepScheduler", config, steps, monkeypatch)


@pytest.mark.parametrize("name", NAMES)
def test_timesteps_match_diffusers(name):
    for spacing, offset in (("leading", 1), ("trailing", 0), ("linspace", 0)):
        config = {"timestep_spacing": spacing, "steps_offset": offset}
        ours, theirs = getattr(diffusion, name)(**config), getattr(diffusers, name)(**config)
        for steps in (1, 2, 3, 4, 10, 25, 50):
            if name == "PNDMScheduler" and steps < 4:  # its Runge-Kutta warm-up needs four timesteps
                with pytest.raises(ValueError, match="skip_prk_steps=False needs num_inference_steps >= 4"):
                    ours.set_timesteps(steps)
                continue
            ours.set_timesteps(steps)
            theirs.set_timesteps(steps)
            assert ours.timesteps.tolist() == theirs.timesteps.tolist(), (spacing, steps)
            assert ours.init_noise_sigma == pytest.approx(float(theirs.init_noise_sigma), rel=1e-6)
        assert ours.order == theirs.order


@pytest.mark.parametrize("kwargs", [{"num_inference_steps": 4, "strength": 0.5},
                                    {"num_inference_steps": 6, "original_inference_steps": 20},
                                    {"timesteps": [999, 759, 499, 259], "strength": 0.6}])
def test_lcm_schedule_options_match_diffusers(kwargs):
    ours, theirs = diffusion.LCMScheduler(), diffusers.LCMScheduler()
    ours.set_timesteps(**kwargs)
    theirs.set_timesteps(**kwargs)
    assert ours.timesteps.tolist() == theirs.timesteps.tolist()


def test_lcm_step_returns_denoised():
    scheduler, x = diffusion.LCMScheduler(), tc.tensor(start_sample())
    run = scheduler.start(2)
    out = run.step(x * 0.5, run.timesteps[0], x, variance_noise=tc.tensor(step_noises(1)[0]))
    assert out.denoised is out.pred_original_sample and len(out.to_tuple()) == 2
    last = run.step(x * 0.5, run.timesteps[1], out.prev_sample, return_dict=False)
    assert last[0] is last[1]  # the last step adds no noise: the sample is the denoised one


def test_add_noise_and_scaling_match_diffusers():
    x0, noise = start_sample(seed=3), step_noises(1, seed=4)[0]
    for name in NAMES:
        ours, theirs = getattr(diffusion, name)(), getattr(diffusers, name)()
        ours.set_timesteps(10)
        theirs.set_timesteps(10)
        t = theirs.timesteps[2]
        expected = theirs.add_noise(torch.from_numpy(x0), torch.from_numpy(noise), t.reshape(1))
        got = ours.add_noise(tc.tensor(x0), tc.tensor(noise), ours.timesteps[2:3])
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
        scaled = ours.scale_model_input(tc.tensor(x0), ours.timesteps[0])
        np.testing.assert_allclose(scaled.numpy(), theirs.scale_model_input(torch.from_numpy(x0), t).numpy()
                                   if name != "EulerAncestralDiscreteScheduler" else
                                   theirs.scale_model_input(torch.from_numpy(x0), theirs.timesteps[0]).numpy(),
                                   rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("name", NAMES)
def test_two_runs_of_one_scheduler_do_not_interfere(name):
    scheduler = getattr(diffusion, name)(**({"skip_prk_steps": True} if name == "PNDMScheduler" else {}))
    starts, noises = (start_sample(seed=5), start_sample(seed=6)), (step_noises(8, seed=7), step_noises(8, seed=8))
    noises = noises if name in NOISY else (None, None)
    alone = [sample_loop(scheduler.start(8), x, n, {}) for x, n in zip(starts, noises)]
    runs = [scheduler.start(8), scheduler.start(8)]
    samples = [tc.tensor(x * np.float32(runs[0].init_noise_sigma)) for x in starts]
    for k in range(8):  # the two generations' steps interleave
        for j, run in enumerate(runs):
            t = run.timesteps[k]
            output = tc.tensor(smooth_model(run.scale_model_input(samples[j], t).numpy(), float(t)))
            kwargs = {"variance_noise": tc.tensor(noises[j][k])} if noises[j] is not None else {}
            samples[j] = run.step(output, t, samples[j], **kwargs).prev_sample
    for got, expected in zip(samples, alone):
        np.testing.assert_array_equal(got.numpy(), expected)


@pytest.mark.parametrize("name", NAMES)
def test_scheduler_config_json_loads_by_class_name(name, tmp_path):
    """A folder's scheduler_config.json written by diffusers loads as the class it names."""
    getattr(diffusers, name)(**SD).save_config(tmp_path)
    theirs = getattr(diffusers, name).from_pretrained(tmp_path)
    ours = SCHEDULERS[name].from_pretrained(tmp_path)
    assert type(ours) is getattr(diffusion, name)
    assert all(ours.config[k] == v for k, v in theirs.config.items() if not k.startswith("_"))
    ours.save_config(tmp_path / "ours")
    again = getattr(diffusers, name).from_pretrained(tmp_path / "ours")
    public = [{k: v for k, v in c.items() if not k.startswith("_")} for c in (again.config, theirs.config)]
    assert public[0] == public[1]


@pytest.mark.parametrize("name,config,match", [
    ("PNDMScheduler", {"prediction_type": "sample"}, r"prediction_type must be one of \('epsilon', 'v_prediction'\)"),
    ("PNDMScheduler", {"beta_schedule": "sigmoid"}, "beta_schedule must be one of"),
    ("PNDMScheduler", {"skip_prk_steps": 1}, "skip_prk_steps must be a bool, got 1"),
    ("EulerAncestralDiscreteScheduler", {"prediction_type": "sample"}, "prediction_type must be one of"),
    ("EulerAncestralDiscreteScheduler", {"timestep_spacing": "even"}, "timestep_spacing must be one of"),
    ("LCMScheduler", {"original_inference_steps": 0}, "original_inference_steps must be an int >= 1, got 0"),
    ("LCMScheduler", {"original_inference_steps": 2000}, r"original_inference_steps \(2000\) cannot be larger"),
    ("LCMScheduler", {"timestep_scaling": -1.0}, "timestep_scaling must be a float > 0"),
    ("UniPCMultistepScheduler", {"solver_type": "bh3"}, "solver_type must be one of"),
    ("UniPCMultistepScheduler", {"solver_order": 4}, r"solver_order must be one of \(1, 2, 3\)"),
    ("UniPCMultistepScheduler", {"disable_corrector": [1.5]}, "disable_corrector must be a list of step indices"),
    ("UniPCMultistepScheduler", {"solver_p": "DPMSolverMultistepScheduler"}, r"solver_p must be one of \(None,\)"),
    ("UniPCMultistepScheduler", {"use_flow_sigmas": True}, "use_flow_sigmas must be one of"),
    ("UniPCMultistepScheduler", {"use_karras_sigmas": True, "use_exponential_sigmas": True}, "only one of"),
])
def test_bad_configs_raise(name, config, match):
    with pytest.raises(ValueError, match=match):
        getattr(diffusion, name)(**config)


@pytest.mark.parametrize("name,call,match", [
    ("LCMScheduler", {"num_inference_steps": 60}, r"num_inference_steps \(60\) must be at most"),
    ("LCMScheduler", {"num_inference_steps": 4, "strength": 0.0}, "strength must be a float in"),
    ("LCMScheduler", {"num_inference_steps": 4, "original_inference_steps": 5000}, "original_inference_steps must"),
    ("PNDMScheduler", {"timesteps": [999, 500, 1]}, "custom timesteps are not supported"),
    ("UniPCMultistepScheduler", {"num_inference_steps": 8, "strength": 0.5}, "unexpected arguments"),
])
def test_bad_schedules_raise(name, call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        getattr(diffusion, name)().start(**call)


def test_unipc_singular_final_step_is_refused():
    with pytest.raises(ValueError, match="singular; use lower_order_final=True"):
        diffusion.UniPCMultistepScheduler(solver_order=3, lower_order_final=False).start(10)


def test_guidance_scale_embedding_matches_diffusers():
    from diffusers.pipelines.latent_consistency_models.pipeline_latent_consistency_text2img import \
        LatentConsistencyModelPipeline
    w = np.array([0.0, 1.5, 7.0], dtype=np.float32)
    for dim in (256, 33):
        expected = LatentConsistencyModelPipeline.get_guidance_scale_embedding(None, torch.from_numpy(w), dim)
        got = diffusion.get_guidance_scale_embedding(tc.tensor(w), dim)
        assert got.shape == tuple(expected.shape) and got.dtype == tc.float32
        # sin(1000 w f) for w up to 7: torch's float32 exp may be an ulp off in f
        np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=5e-4)
    with pytest.raises(ValueError, match="w must be a 1-D tensor"):
        diffusion.get_guidance_scale_embedding(tc.tensor(w).reshape(3, 1))
    with pytest.raises(ValueError, match="embedding_dim must be an int >= 4"):
        diffusion.get_guidance_scale_embedding(tc.tensor(w), 2)


def smooth_model64(sample: np.ndarray, t: float) -> np.ndarray:
    return smooth_model(sample, t).astype(np.float64)


@pytest.mark.parametrize("name,config", [("PNDMScheduler", {"skip_prk_steps": True}), ("PNDMScheduler", {}),
                                         ("EulerAncestralDiscreteScheduler", {}), ("LCMScheduler", {}),
                                         ("UniPCMultistepScheduler", {"solver_order": 3})])
def test_float64_samples_stay_float64_and_match_diffusers(name, config, monkeypatch):
    """diffusers' float32 tables and coefficients bound the agreement (about 3e-7 of the largest value)."""
    x, noises = start_sample().astype(np.float64), [n.astype(np.float64) for n in step_noises(16)]
    theirs = getattr(diffusers, name)(**config)
    theirs.set_timesteps(8)
    step = 0
    if name in NOISY:
        module = diffusers.schedulers.scheduling_lcm if name == "LCMScheduler" else \
            diffusers.schedulers.scheduling_euler_ancestral_discrete
        monkeypatch.setattr(module, "randn_tensor", lambda shape, **kw: torch.from_numpy(noises[step]))
    expected = torch.from_numpy(x) * theirs.init_noise_sigma
    for step, t in enumerate(theirs.timesteps):
        output = torch.from_numpy(smooth_model64(theirs.scale_model_input(expected, t).numpy(), float(t)))
        expected = theirs.step(output, t, expected).prev_sample
    got = sample_loop(getattr(diffusion, name)(**config).start(8), x, noises if name in NOISY else None, {},
                      smooth_model64)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected.numpy(), rtol=0, atol=1e-6 * np.abs(expected.numpy()).max())


def test_a_runge_kutta_run_cannot_start_part_way():
    run = diffusion.PNDMScheduler().start(10)
    run.set_begin_index(3)
    x = tc.tensor(start_sample())
    with pytest.raises(ValueError, match="starts at its first timestep; use skip_prk_steps=True"):
        run.step(x, run.timesteps[3], x)
