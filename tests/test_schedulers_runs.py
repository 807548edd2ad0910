"""Per-generation runs: concurrency, the default run, positions, devices, dtypes and errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tensorcore as tc
from diffusion import DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler
from scheduler_cases import sample_loop, smooth_model, start_sample, step_noises

ALL = [DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler]
# configs and step arguments that exercise each scheduler's state and noise
CASES = [
    (DDIMScheduler, {}, {"eta": 0.5}),
    (DDPMScheduler, {"variance_type": "fixed_small_log"}, {}),
    (DPMSolverMultistepScheduler, {"solver_order": 3}, {}),
    (DPMSolverMultistepScheduler, {"algorithm_type": "sde-dpmsolver++", "use_karras_sigmas": True}, {}),
    (EulerDiscreteScheduler, {"use_karras_sigmas": True}, {"s_churn": 0.5}),
]
CASE_IDS = ["ddim", "ddpm", "dpm3", "dpm-sde-karras", "euler-churn"]


def generation(run, seed: int, step_kwargs: dict):
    """A generator that takes one step per ``next`` and finally yields the sample."""
    x, noises = start_sample(seed=seed), step_noises(len(run), seed=seed + 100)
    sample = tc.tensor(x * np.float32(run.init_noise_sigma))
    for k in range(len(run)):
        t = run.timesteps[k]
        output = tc.tensor(smooth_model(run.scale_model_input(sample, t).numpy(), float(t)))
        sample = run.step(output, t, sample, variance_noise=tc.tensor(noises[k]), **step_kwargs).prev_sample
        yield None
    yield sample.numpy()


def finish(gen) -> np.ndarray:
    for value in gen:
        if value is not None:
            return value


@pytest.mark.parametrize("cls,config,step_kwargs", CASES, ids=CASE_IDS)
def test_interleaved_runs_match_runs_alone(cls, config, step_kwargs):
    scheduler = cls(**config)
    alone_a = finish(generation(scheduler.start(12), 0, step_kwargs))
    alone_b = finish(generation(scheduler.start(7), 1, step_kwargs))
    a, b = generation(scheduler.start(12), 0, step_kwargs), generation(scheduler.start(7), 1, step_kwargs)
    results = {}
    while len(results) < 2:  # one step of each in turn until both are done
        for name, gen in (("a", a), ("b", b)):
            if name not in results:
                value = next(gen)
                if value is not None:
                    results[name] = value
    np.testing.assert_array_equal(results["a"], alone_a)
    np.testing.assert_array_equal(results["b"], alone_b)


@pytest.mark.parametrize("cls,config,step_kwargs", CASES[2:4], ids=CASE_IDS[2:4])
def test_runs_in_threads_match_runs_alone(cls, config, step_kwargs):
    scheduler = cls(**config)
    expected = [finish(generation(scheduler.start(9), seed, step_kwargs)) for seed in range(4)]
    got: dict[int, np.ndarray] = {}

    def work(seed: int) -> None:
        got[seed] = finish(generation(scheduler.start(9), seed, step_kwargs))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for seed in range(4):
        np.testing.assert_array_equal(got[seed], expected[seed])


@pytest.mark.parametrize("cls,config,step_kwargs", CASES, ids=CASE_IDS)
def test_default_run_is_a_run(cls, config, step_kwargs):
    x, noises = start_sample(), step_noises(10)
    scheduler = cls(**config)
    scheduler.set_timesteps(10)
    via_scheduler = sample_loop(scheduler, x, noises, step_kwargs)
    via_run = sample_loop(cls(**config).start(10), x, noises, step_kwargs)
    np.testing.assert_array_equal(via_scheduler, via_run)
    assert scheduler.step_index == 10 and scheduler.num_inference_steps == 10


def test_dpm_karras_cosine_repeats_timesteps_and_steps_by_position():
    scheduler = DPMSolverMultistepScheduler(beta_schedule="squaredcos_cap_v2", use_karras_sigmas=True)
    run = scheduler.start(7)
    assert run.timesteps.tolist() == [998, 998, 998, 997, 983, 682, 0]
    assert np.all(np.diff(run.sigmas.numpy()) < 0)  # every σ visited once, down to 0
    # with an exact ε model every step lands on x = α x0 + σ ε of the next σ, and the last on x0
    rng = np.random.default_rng(0)
    x0, noise = tc.tensor(rng.uniform(-1, 1, (2, 3, 4, 4))), tc.tensor(rng.standard_normal((2, 3, 4, 4)))
    sample = run.add_noise(x0, noise)
    for t in run.timesteps:
        sample = run.step(noise, t, sample).prev_sample
    assert run.finished
    # (float32 σ tables, as diffusers': x̂₀ = (x - σ ε) / α at σ ≈ 2e4 is good to ~1e-3)
    np.testing.assert_allclose(sample.numpy(), x0.numpy(), atol=5e-3)


def test_ddim_prev_timestep_from_schedule_lands_on_the_schedule():
    """With an exact ε model DDIM (eta 0) moves x_t to exactly x at its target timestep."""
    rng = np.random.default_rng(0)
    x0 = tc.tensor(rng.uniform(-1, 1, (2, 3, 4, 4)))
    noise = tc.tensor(rng.standard_normal((2, 3, 4, 4)))
    results = {}
    for fix in (False, True):
        scheduler = DDIMScheduler(timestep_spacing="linspace", clip_sample=False, prev_timestep_from_schedule=fix)
        run = scheduler.start(10)
        timesteps = run.timesteps.tolist()  # 999, 888, ..., 111, 0
        sample = scheduler.add_noise(x0, noise, timesteps[0])
        for k, t in enumerate(timesteps):
            sample = run.step(noise, t, sample).prev_sample
            if fix:  # each step lands on the next timestep of the schedule, the last on x0
                expected = scheduler.add_noise(x0, noise, timesteps[k + 1]) if k + 1 < len(timesteps) else x0
                np.testing.assert_allclose(sample.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
            elif k == 0:  # diffusers' target t - T // N = 899 lies between 999 and 888
                np.testing.assert_allclose(sample.numpy(), scheduler.add_noise(x0, noise, 899).numpy(), rtol=1e-5)
        results[fix] = sample.numpy()
    np.testing.assert_allclose(results[True], x0.numpy(), atol=5e-5)
    assert np.abs(results[False] - x0.numpy()).max() > 1e-3  # the skipped noise levels leave an error


def test_trailing_spacing_never_yields_an_extra_negative_timestep():
    # float steps of 1000 / 61 make arange yield a 62nd point, which diffusers keeps as -1
    for cls in ALL:
        timesteps = cls(timestep_spacing="trailing").start(61).timesteps.numpy()
        assert len(timesteps) == 61 and timesteps.min() >= 0 and timesteps[0] == 999


def test_begin_index_starts_part_way():
    scheduler = DPMSolverMultistepScheduler()
    full, late = scheduler.start(10), scheduler.start(10)
    late.set_begin_index(4)
    assert late.step_index == 4
    x0, noise = tc.tensor(start_sample()), tc.tensor(step_noises(1)[0])
    noisy = late.add_noise(x0, noise)
    sigma = late.sigmas.numpy()[4]
    alpha = 1 / np.sqrt(sigma ** 2 + 1)
    np.testing.assert_allclose(noisy.numpy(), alpha * x0.numpy() + sigma * alpha * noise.numpy(), rtol=1e-6)
    late.step(noise, late.timestep_at(4), noisy)
    with pytest.raises(ValueError, match="already taken"):
        late.set_begin_index(0)
    with pytest.raises(ValueError, match="begin_index"):
        full.set_begin_index(10)


def test_run_refuses_an_off_schedule_timestep_and_a_step_past_the_end():
    run = DDIMScheduler().start(2)
    x = tc.zeros(1, 1, 2, 2)
    with pytest.raises(ValueError, match="timestep 500 is not the run's timestep 500|is not the run's"):
        run.step(x, 0, x)
    run.step(x, 500, x)
    run.step(x, tc.tensor(0), x)
    with pytest.raises(ValueError, match="finished its 2 steps"):
        run.step(x, 0, x)
    with pytest.raises(TypeError, match="timestep must be a number"):
        DDIMScheduler().start(2).step(x, "500", x)


@pytest.mark.parametrize("cls", [DDIMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler])
def test_step_before_set_timesteps_raises(cls):
    x = tc.zeros(1, 1, 2, 2)
    with pytest.raises(ValueError, match="set_timesteps"):
        cls().step(x, 999, x)


def test_ddpm_steps_the_training_schedule_without_set_timesteps():
    scheduler = DDPMScheduler()
    x, z = tc.tensor(start_sample()), tc.tensor(step_noises(1)[0])
    out = scheduler.step(x * 0.5, 10, x, variance_noise=z)
    run = scheduler.start(timesteps=[10, 9])
    np.testing.assert_array_equal(out.prev_sample.numpy(), run.step(x * 0.5, 10, x, variance_noise=z).prev_sample.numpy())
    assert scheduler.timesteps.numpy()[0] == 999 and len(scheduler.timesteps) == 1000


@pytest.mark.parametrize("cls", ALL)
def test_bad_run_arguments_raise_naming_the_value(cls):
    scheduler = cls()
    with pytest.raises(ValueError, match=r"num_inference_steps \(1001\).*num_train_timesteps \(1000\)"):
        scheduler.start(1001)
    with pytest.raises(ValueError, match="positive int, got 0"):
        scheduler.set_timesteps(0)
    with pytest.raises(ValueError, match="exactly one"):
        scheduler.start()


def test_bad_step_arguments_raise_before_the_run_moves():
    run = DDIMScheduler().start(4)
    x = tc.zeros(1, 1, 2, 2)
    t = run.timestep_at(0)
    with pytest.raises(ValueError, match="eta must be a float >= 0, got -0.5"):
        run.step(x, t, x, eta=-0.5)
    with pytest.raises(ValueError, match=r"model_output has shape \(1, 1, 2, 3\)"):
        run.step(tc.zeros(1, 1, 2, 3), t, x)
    with pytest.raises(ValueError, match="either generator or variance_noise"):
        run.step(x, t, x, eta=1.0, generator=tc.Generator(seed=0), variance_noise=x)
    with pytest.raises(ValueError, match="variance_noise has shape"):
        run.step(x, t, x, eta=1.0, variance_noise=tc.zeros(2, 1, 2, 2))
    assert run.position == 0
    with pytest.raises(ValueError, match="custom timesteps"):
        DPMSolverMultistepScheduler(use_karras_sigmas=True).start(timesteps=[900, 500, 100])
    with pytest.raises(ValueError, match="descend"):
        DDPMScheduler().start(timesteps=[100, 500])


def test_generator_noise_is_reproducible():
    scheduler = DDIMScheduler()
    x = tc.tensor(start_sample())
    outs = []
    for _ in range(2):
        run = scheduler.start(5)
        outs.append(run.step(x, run.timestep_at(0), x, eta=1.0, generator=tc.Generator(seed=5)).prev_sample.numpy())
    np.testing.assert_array_equal(*outs)
    quiet = scheduler.start(5).step(x, 800, x, eta=0.0).prev_sample.numpy()
    assert not np.allclose(outs[0], quiet)


def test_euler_warns_when_the_input_was_not_scaled():
    run = EulerDiscreteScheduler().start(3)
    x = tc.zeros(1, 1, 2, 2)
    with pytest.warns(UserWarning, match="scale_model_input"):
        run.step(x, run.timestep_at(0), x)


@pytest.mark.parametrize("cls,config,step_kwargs", CASES, ids=CASE_IDS)
def test_steps_read_nothing_back_from_the_device(cls, config, step_kwargs, monkeypatch):
    """A step takes its timestep from the run (host) and never reads a tensor's values."""
    run = cls(**config).start(6)
    x = tc.tensor(start_sample())
    noises = [tc.tensor(n) for n in step_noises(6)]

    def refuse(*args, **kwargs):
        raise AssertionError("a step read tensor values back to the host")

    for name in ("item", "numpy", "tolist", "__array__", "__float__", "__int__", "__bool__", "__index__"):
        monkeypatch.setattr(tc.Tensor, name, refuse)
    for k in range(6):
        t = run.timestep_at(k)
        model_input = run.scale_model_input(x, t)
        x = run.step(model_input * 0.5, t, x, variance_noise=noises[k], **step_kwargs).prev_sample
    monkeypatch.undo()
    assert np.all(np.isfinite(x.numpy()))


@pytest.mark.parametrize("cls,config,step_kwargs", CASES[:3], ids=CASE_IDS[:3])
def test_sample_dtype_is_kept(cls, config, step_kwargs):
    x, noises = start_sample(), step_noises(8)
    run32 = cls(**config).start(8)
    reference = sample_loop(run32, x, noises, step_kwargs)
    run64 = cls(**config).start(8)
    sample = tc.tensor(x.astype(np.float64))
    for k, t in enumerate(run64.timesteps):
        output = tc.tensor(smooth_model(sample.numpy().astype(np.float32), float(t)).astype(np.float64))
        sample = run64.step(output, t, sample, variance_noise=tc.tensor(noises[k].astype(np.float64)),
                            **step_kwargs).prev_sample
        assert sample.dtype == np.float64
    np.testing.assert_allclose(sample.numpy(), reference, rtol=1e-3, atol=1e-4)
    half = cls(**config).start(2)
    h = tc.tensor(x.astype(np.float16))
    out = half.step(h * 0.5, half.timestep_at(0), h, variance_noise=tc.tensor(noises[0]).half(), **step_kwargs)
    assert out.prev_sample.dtype == np.float16


def test_backends_agree(backend):
    x, noises = start_sample(), step_noises(8)
    with tc.use_backend("numpy"):
        expected = sample_loop(DPMSolverMultistepScheduler(solver_order=3).start(8), x, None, {})
    got = sample_loop(DPMSolverMultistepScheduler(solver_order=3).start(8), x, None, {})
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    ddim = sample_loop(DDIMScheduler().start(8), x, noises, {"eta": 1.0})
    with tc.use_backend("numpy"):
        np.testing.assert_allclose(ddim, sample_loop(DDIMScheduler().start(8), x, noises, {"eta": 1.0}),
                                   rtol=1e-6, atol=1e-6)


def test_step_output_forms():
    run = DDIMScheduler().start(3)
    x = tc.tensor(start_sample())
    out = run.step(x, run.timestep_at(0), x)
    assert out[0] is out.prev_sample and out["pred_original_sample"] is out.pred_original_sample
    prev, original = run.step(x, run.timestep_at(1), x, return_dict=False)
    assert prev.shape == original.shape == x.shape


@pytest.mark.gpu
@pytest.mark.parametrize("cls,config,step_kwargs", CASES, ids=CASE_IDS)
def test_cuda_runs_match_cpu(cls, config, step_kwargs):
    scheduler = cls(**config)
    x, noises = start_sample(), step_noises(8)
    expected = sample_loop(scheduler.start(8), x, noises, step_kwargs)
    cpu_tables = set(scheduler.tables._device)
    run = scheduler.start(8, device="cuda")
    sample = tc.tensor(x * np.float32(run.init_noise_sigma), device="cuda")
    for k, t in enumerate(run.timesteps):
        model_input = run.scale_model_input(sample, t)
        output = tc.tensor(smooth_model(model_input.numpy(), float(t.item())), device="cuda")
        sample = run.step(output, t, sample, variance_noise=tc.tensor(noises[k], device="cuda"),
                          **step_kwargs).prev_sample
        assert sample.device == "cuda" and t.device == "cuda"
    # every table the GPU run used was uploaded to the GPU (some solvers keep only host scalars)
    assert all(key[1] == "cuda" for key in set(scheduler.tables._device) - cpu_tables)
    np.testing.assert_allclose(sample.numpy(), expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("cls", ALL)
def test_schedulers_copy_and_pickle(cls):
    import copy
    import pickle

    scheduler = cls(beta_schedule="scaled_linear")
    x = tc.tensor(start_sample())
    scheduler.add_noise(x, x, 10)  # fills the device table cache
    for twin in (copy.deepcopy(scheduler), pickle.loads(pickle.dumps(scheduler))):
        assert twin.config == scheduler.config
        np.testing.assert_array_equal(twin.add_noise(x, x, 10).numpy(), scheduler.add_noise(x, x, 10).numpy())


def test_ddpm_learned_variance_needs_the_variance_channels():
    run = DDPMScheduler(variance_type="learned_range").start(4)
    x = tc.zeros(1, 3, 2, 2)
    with pytest.raises(ValueError, match=r"needs a model output of 2 x 3 channels"):
        run.step(x, run.timestep_at(0), x)
    with pytest.raises(ValueError, match="whole number in"):
        DDPMScheduler().step(x, 10.5, x)
