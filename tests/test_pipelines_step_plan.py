"""The whole denoising step as one compiled plan: UNet, guidance combine, scheduler update and
non-finite guard in one call per step, a few plans per run (each serving many steps), the same
images as the eager pipeline for the same seed, sync and async.

Plans per run (one per distinct static variant of the step; guidance on and off are two
pipelines' worth of keys): DDIM 1 (eta 0 or > 0), DDPM 2 when the run ends on timestep 0
(its last step adds no noise), DPM-Solver++ 2M 2 (orders 1 and 2), 3M 3, Euler 1.
"""

from __future__ import annotations

import asyncio
import inspect
import warnings

import numpy as np
import pytest

import tensorcore as tc
from diffusion import (DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                       EulerDiscreteScheduler, LCMScheduler, PNDMScheduler, UniPCMultistepScheduler)
from diffusion.pipelines import DiffusionPipeline
from diffusion.schedulers.run import StepArgs
from pipeline_helpers import NUM_CLASSES, same, tiny_unet
from scheduler_cases import sample_loop, smooth_model, start_sample, step_noises

STEPS = 5

# (scheduler, generate options, plans per run)
PIPELINE_CASES = {
    "ddim": (DDIMScheduler, {}, 1),
    "ddim-eta": (DDIMScheduler, {"eta": 0.7}, 1),
    "ddpm": (DDPMScheduler, {}, 2),
    "dpm2m": (DPMSolverMultistepScheduler, {}, 2),
    "euler": (EulerDiscreteScheduler, {}, 1),
}


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORCORE_CACHE_DIR", str(tmp_path / "cache"))


def options(guidance: float, **kwargs):
    return {**dict(batch_size=2, num_inference_steps=STEPS, seed=0, class_labels=[0, 2], progress=False,
                   guidance_scale=guidance), **kwargs}


def pipelines(scheduler):
    unet = tiny_unet()
    return (DiffusionPipeline(unet, scheduler, null_class_label=NUM_CLASSES, compile=False),
            DiffusionPipeline(unet, scheduler, null_class_label=NUM_CLASSES, compile=True))


# ----- the pipeline: same images, one call per step, the claimed plans --------------------------------
@pytest.mark.parametrize("case", list(PIPELINE_CASES))
def test_compiled_step_equals_eager_sync_and_async(backend, case):
    cls, extra, plans = PIPELINE_CASES[case]
    eager, compiled = pipelines(cls())
    generations = 0
    for guidance in (1.0, 2.5):
        expected = eager.generate(**options(guidance, **extra))
        before = compiled.denoiser.cache_info().traces
        got = compiled.generate(**options(guidance, **extra))
        assert compiled.denoiser.cache_info().traces - before == plans  # plans per run
        got_async = asyncio.run(compiled.generate_async(**options(guidance, **extra)))
        generations += 2
        # bit-identical on the CPU backends: the replayed calls are eager's kernels
        assert same(got.images, expected.images) and same(got_async.images, expected.images)
        assert got.nonfinite_count == got_async.nonfinite_count == expected.nonfinite_count == 0
    info = compiled.denoiser.cache_info()
    # one compiled call per step, every one of them replayed or traced, none eager
    assert info.hits + info.misses == generations * STEPS
    assert (info.traces, info.fallbacks, info.plans) == (2 * plans, 0, 2 * plans)


def test_a_pndm_generation_takes_every_timestep_of_its_run():
    """PLMS repeats its second timestep: 5 inference steps are 6 UNet calls, as in diffusers."""
    eager, compiled = pipelines(PNDMScheduler(skip_prk_steps=True))
    seen: list[int] = []
    expected = eager.generate(**options(2.5, callback=lambda index, t, sample: seen.append(t)))
    got = compiled.generate(**options(2.5))
    run = PNDMScheduler(skip_prk_steps=True).start(STEPS)
    assert seen == run.schedule.tolist() and len(seen) == STEPS + 1
    assert same(got.images, expected.images)
    info = compiled.denoiser.cache_info()
    assert (info.hits + info.misses, info.traces) == (STEPS + 1, 4)  # plans reading 0, 1, 2, 3 kept outputs


def test_the_plan_holds_the_whole_step(backend):
    _, compiled = pipelines(DDPMScheduler())
    compiled.generate(**options(2.5, num_inference_steps=3))
    graphs = [info["graph"] for info in compiled.denoiser.plan_info()]
    assert len(graphs) == 2
    for graph in graphs:  # the UNet, the guard, and the scheduler's arithmetic
        assert all(op in graph for op in ("conv2d", "isnan", "isinf", "sqrt"))
    # the noisy steps draw inside the plan when the generator outlives the call (see below);
    # with a seed the noise is an input, so no plan draws
    assert not any("normal" in graph for graph in graphs)


def test_a_callers_generator_draws_inside_the_plan_and_advances_as_eager(backend):
    eager, compiled = pipelines(DDIMScheduler())
    device = next(iter(eager.unet.parameters())).device  # a generator on the model's device draws in the plan
    mine, theirs = tc.Generator(device, seed=11), tc.Generator(device, seed=11)
    extra = dict(seed=None, eta=1.0)
    first, second = (eager.generate(**options(2.5, generator=mine, **extra)) for _ in range(2))
    got_first = compiled.generate(**options(2.5, generator=theirs, **extra))
    got_second = asyncio.run(compiled.generate_async(**options(2.5, generator=theirs, **extra)))
    assert same(got_first.images, first.images) and same(got_second.images, second.images)
    assert np.array_equal(mine.get_state(), theirs.get_state())  # the same draws, in the same order
    info = compiled.denoiser.cache_info()
    assert (info.traces, info.hits, info.fallbacks) == (1, 2 * STEPS - 1, 0)  # one plan for both generations
    assert "normal" in compiled.denoiser.plan_info()[0]["graph"]


def test_new_seeds_replay_the_same_plan(backend):
    eager, compiled = pipelines(DDPMScheduler())
    for seed in (0, 1, 2):
        assert same(compiled.generate(**options(1.0, seed=seed)).images,
                    eager.generate(**options(1.0, seed=seed)).images)
    assert compiled.denoiser.cache_info().traces == 2  # a seed's generator is not bound into the plan


def test_concurrent_compiled_generations_keep_their_own_history():
    eager, compiled = pipelines(DPMSolverMultistepScheduler(solver_order=3))

    async def both():
        return await asyncio.gather(*(compiled.generate_async(**options(2.5, seed=seed)) for seed in (0, 1)))

    results = asyncio.run(both())  # the two runs' steps interleave on one set of plans
    for seed, result in zip((0, 1), results):
        assert same(result.images, eager.generate(**options(2.5, seed=seed)).images)
    assert compiled.denoiser.cache_info().traces == 3


def test_the_guard_inside_the_plan_counts_as_eager(backend):
    unet = tiny_unet()
    with tc.no_grad():
        unet.conv_out.bias.data[...] = np.float32(np.nan)  # every output value is NaN
    eager = DiffusionPipeline(unet, DDIMScheduler(), null_class_label=NUM_CLASSES, compile=False)
    compiled = DiffusionPipeline(unet, DDIMScheduler(), null_class_label=NUM_CLASSES, compile=True)
    with pytest.warns(RuntimeWarning, match="non-finite values"):
        expected = eager.generate(**options(2.5))
    with pytest.warns(RuntimeWarning, match="non-finite values") as caught:
        got = compiled.generate(**options(2.5))
    assert len([w for w in caught if w.category is RuntimeWarning]) == 1
    assert got.nonfinite_count == expected.nonfinite_count == 2 * 8 * 8 * STEPS
    assert same(got.images, expected.images)
    assert compiled.denoiser.cache_info().traces == 1


def test_a_step_that_cannot_be_traced_runs_eagerly_with_one_warning():
    scheduler = DDIMScheduler(thresholding=True)  # dynamic thresholding's quantile is not a backend op
    eager, compiled = pipelines(scheduler)
    with pytest.warns(tc.compile.CompileWarning, match="backend.xp.quantile"):
        got = compiled.generate(**options(1.0))
    assert same(got.images, eager.generate(**options(1.0)).images)
    info = compiled.denoiser.cache_info()
    assert info.plans == 0 and info.fallbacks == STEPS


# ----- the scheduler's device part alone: one plan serves every step of a run ----------------------
SCHEDULER_CASES = {
    "ddim-eta": (DDIMScheduler, {}, {"eta": 0.5}, 8, 1),
    "ddim-from-schedule": (DDIMScheduler, {"prev_timestep_from_schedule": True, "timestep_spacing": "trailing"},
                           {}, 8, 1),
    "ddpm-learned": (DDPMScheduler, {"variance_type": "learned_range"}, {}, 8, 2),
    "ddpm-offset": (DDPMScheduler, {"steps_offset": 1}, {}, 8, 1),  # ends on t = 1: noise at every step
    "dpm2m": (DPMSolverMultistepScheduler, {}, {}, 8, 2),
    "dpm2m-20": (DPMSolverMultistepScheduler, {"lower_order_final": False}, {}, 20, 2),
    "dpm3m": (DPMSolverMultistepScheduler, {"solver_order": 3}, {}, 8, 3),
    "dpm-sde-karras": (DPMSolverMultistepScheduler, {"algorithm_type": "sde-dpmsolver++",
                                                     "use_karras_sigmas": True}, {}, 8, 2),
    "euler-churn": (EulerDiscreteScheduler, {"use_karras_sigmas": True}, {"s_churn": 0.5}, 8, 1),
    "pndm-plms": (PNDMScheduler, {"skip_prk_steps": True}, {}, 8, 4),  # reading 0..3 kept outputs
    "pndm-prk": (PNDMScheduler, {}, {}, 5, 3),  # 12 Runge-Kutta stages reading 0, 1 or 3, then PLMS
    "euler-ancestral": (EulerAncestralDiscreteScheduler, {}, {}, 8, 1),
    "lcm": (LCMScheduler, {}, {}, 4, 2),  # the last step adds no noise
    "unipc": (UniPCMultistepScheduler, {}, {}, 8, 3),  # 0, 1, then 2 kept outputs
}


def learned_model(x: np.ndarray, t: float) -> np.ndarray:
    """``smooth_model`` with a predicted variance in [-1, 1] as a second half of channels."""
    output = smooth_model(x, t)
    return np.concatenate([output, np.tanh(output)], axis=1)


def compiled_loop(scheduler, run, x: np.ndarray, noises: list[np.ndarray], step_kwargs: dict,
                  model) -> tuple[np.ndarray, int]:
    """``sample_loop`` with the model input and the step's device part compiled; (the final
    sample, plans traced for the step)."""
    @tc.compile
    def device_step(values, history, model_output, sample, variant, noise, noise_dtype):
        args = StepArgs(variant, values, history, noise, noise_dtype)
        return scheduler.step_update(args, model_output, sample)

    @tc.compile
    def model_input(values, sample, variant):
        return scheduler.step_input(StepArgs(variant, values), sample)

    sample = tc.tensor(x * np.float32(run.init_noise_sigma))
    for k, t in enumerate(run.timesteps):
        noise = {"variance_noise": tc.tensor(noises[k])} if noises is not None else {}
        args = run.prepare_step(sample, t, **noise, **step_kwargs)
        output = tc.tensor(model(model_input(args.values, sample, args.variant).numpy(), float(t)))
        sample, original = device_step(args.values, args.history, output, sample, args.variant, args.noise,
                                       args.noise_dtype)
        run.finish_step(original)
    info = (device_step.cache_info(), model_input.cache_info())
    assert all(i.hits + i.misses == len(run) and i.fallbacks == 0 for i in info)  # one call per step each
    return sample.numpy(), info[0].traces


@pytest.mark.parametrize("case", list(SCHEDULER_CASES))
def test_one_compiled_scheduler_step_serves_the_run(case):
    cls, config, step_kwargs, steps, plans = SCHEDULER_CASES[case]
    scheduler = cls(**config)
    noisy = "variance_noise" in inspect.signature(scheduler._prepare).parameters  # the step takes noise
    x, noises = start_sample(), step_noises(steps) if noisy else None
    model = learned_model if config.get("variance_type") == "learned_range" else smooth_model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        expected = sample_loop(scheduler.start(steps), x, noises, step_kwargs, model)
        got, traced = compiled_loop(scheduler, scheduler.start(steps), x, noises, step_kwargs, model)
    np.testing.assert_array_equal(got, expected)
    assert traced == plans


# ----- GPU -----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(PIPELINE_CASES))
def test_gpu_compiled_step_matches_eager(case):
    cls, extra, plans = PIPELINE_CASES[case]
    with tc.use_backend("cupy"):
        unet = tiny_unet().to("cuda")
        eager = DiffusionPipeline(unet, cls(), null_class_label=NUM_CLASSES, compile=False)
        compiled = DiffusionPipeline(unet, cls(), null_class_label=NUM_CLASSES)
        assert compiled.compile is True
        for guidance in (1.0, 2.5):
            expected = eager.generate(**options(guidance, **extra)).images.numpy()
            for result in (compiled.generate(**options(guidance, **extra)),
                           asyncio.run(compiled.generate_async(**options(guidance, **extra)))):
                # float32 bound: the CUDA graph replays eager's kernels, but the capture-safe GEMM
                # and fused elementwise kernels may round differently in the last bits
                np.testing.assert_allclose(result.images.numpy(), expected, rtol=0, atol=1e-5)
        generator = tc.Generator("cuda", seed=5)  # drawn inside the plan, Philox state on the device
        compiled.generate(**options(2.5, seed=None, generator=generator, **extra))
    info = compiled.denoiser.cache_info()
    extra_plans = 1 if extra.get("eta") or cls is DDPMScheduler else 0  # its noisy steps bind the generator
    assert (info.traces, info.fallbacks) == (2 * plans + extra_plans, 0)
    assert info.hits + info.misses == 5 * STEPS
