"""DiffusionPipeline / LatentDiffusionPipeline: determinism, sync == async, cancellation,
concurrency, the non-finite guard, classifier-free guidance against hand-written loops,
argument checks, and a DDIM loop against diffusers' on the same weights."""

from __future__ import annotations

import asyncio
import time
import warnings

import numpy as np
import pytest

import tensorcore as tc
from diffusion import DDIMScheduler, DDPMScheduler, EulerDiscreteScheduler
from diffusion.pipelines import DiffusionPipeline, LatentDiffusionPipeline
from pipeline_helpers import NUM_CLASSES, Instrumented, same, tiny_unet, tiny_vae

STEPS = 4


def pipeline(unet=None, scheduler=None, **kwargs) -> DiffusionPipeline:
    return DiffusionPipeline(unet if unet is not None else tiny_unet(), scheduler or DDIMScheduler(),
                             null_class_label=NUM_CLASSES, **kwargs)


def generate(pipe, **kwargs):
    options = dict(batch_size=2, num_inference_steps=STEPS, seed=0, class_labels=[0, 2], progress=False)
    return pipe.generate(**{**options, **kwargs})


async def generate_async(pipe, **kwargs):
    options = dict(batch_size=2, num_inference_steps=STEPS, seed=0, class_labels=[0, 2], progress=False)
    return await pipe.generate_async(**{**options, **kwargs})


# ----- determinism, sync == async --------------------------------------------------------
def test_same_seed_same_images_other_seed_other_images() -> None:
    pipe = pipeline()
    a, b, c = generate(pipe, seed=3), generate(pipe, seed=3), generate(pipe, seed=4)
    assert same(a.images, b.images)
    assert not same(a.images, c.images)
    assert a.images.shape == (2, 1, 8, 8) and a.nonfinite_count == 0 and a.steps_run == STEPS
    generator = tc.Generator(seed=3)
    assert same(generate(pipe, seed=None, generator=generator).images, a.images)


@pytest.mark.parametrize("scheduler", [DDIMScheduler(), DDPMScheduler(), EulerDiscreteScheduler()],
                         ids=["ddim", "ddpm", "euler"])
def test_async_is_bit_identical_to_sync(backend, scheduler) -> None:
    pipe = pipeline(scheduler=scheduler)
    guided = dict(guidance_scale=2.5, eta=0.5) if isinstance(scheduler, DDIMScheduler) else {}
    expected = generate(pipe, **guided)
    actual = asyncio.run(generate_async(pipe, **guided))
    assert actual.images.device == pipe.device
    assert same(actual.images, expected.images)


# ----- cancellation ---------------------------------------------------------------------
def test_pre_cancelled_generation_runs_nothing_and_the_next_call_works() -> None:
    unet = Instrumented(tiny_unet())
    pipe = pipeline(unet)

    async def scenario():
        task = asyncio.ensure_future(generate_async(pipe))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert unet.calls == 0
        return await generate_async(pipe)

    after = asyncio.run(scenario())
    assert same(after.images, generate(pipeline()).images)


def test_cancelled_mid_way_stops_at_the_next_step_and_the_next_call_matches_a_fresh_one() -> None:
    state = {}

    def cancel_during_third_call(index, out):
        if index == 2:  # runs in the worker thread while step 2 is in flight
            state["loop"].call_soon_threadsafe(state["task"].cancel)
            time.sleep(0.05)  # the cancellation is delivered while this step still runs
        return out

    unet = Instrumented(tiny_unet(), cancel_during_third_call)
    pipe = pipeline(unet)

    async def scenario():
        state["loop"] = asyncio.get_running_loop()
        state["task"] = asyncio.ensure_future(generate_async(pipe, num_inference_steps=10))
        with pytest.raises(asyncio.CancelledError):
            await state["task"]
        assert unet.calls == 3  # the step in flight finished; no step started after it
        unet.hook = None
        return await generate_async(pipe, num_inference_steps=10)

    after = asyncio.run(scenario())
    assert same(after.images, generate(pipeline(), num_inference_steps=10).images)


def test_event_loop_keeps_ticking_during_a_cpu_generation() -> None:
    def slow(index, out):
        time.sleep(0.02)  # a step that holds the CPU thread for 20 ms (without the GIL)
        return out

    pipe = pipeline(Instrumented(tiny_unet(), slow))
    generate(pipe, num_inference_steps=1)  # kernels compiled before the clock starts

    async def scenario():
        ticks = []
        done = asyncio.Event()

        async def ticker():
            while not done.is_set():
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.001)

        tick_task = asyncio.ensure_future(ticker())
        start = time.perf_counter()
        await generate_async(pipe, num_inference_steps=6)
        elapsed = time.perf_counter() - start
        done.set()
        await tick_task
        return ticks, start, elapsed

    ticks, start, elapsed = asyncio.run(scenario())
    during = [t for t in ticks if start <= t <= start + elapsed]
    assert elapsed >= 6 * 0.02
    # a loop blocked by the steps would tick about once per step; a free one every millisecond or so
    assert len(during) >= 3 * 6, (len(during), elapsed)
    assert max(np.diff(during)) < 0.5 * elapsed


def test_cpu_steps_run_off_the_event_loop_thread() -> None:
    unet = Instrumented(tiny_unet())
    asyncio.run(generate_async(pipeline(unet)))
    assert unet.threads and all(name.startswith("diffusion-generate") for name in unet.threads)


def test_two_concurrent_generations_equal_each_alone(backend) -> None:
    pipe = pipeline()
    first = dict(seed=1, class_labels=[0, 1], guidance_scale=2.0)
    second = dict(seed=2, class_labels=[2, 2], num_inference_steps=STEPS + 2)
    alone = generate(pipe, **first), generate(pipe, **second)

    async def together():
        return await asyncio.gather(generate_async(pipe, **first), generate_async(pipe, **second))

    for result, expected in zip(asyncio.run(together()), alone):
        assert same(result.images, expected.images)


def test_a_compiled_unet_replays_its_plan_in_both_paths(backend) -> None:
    unet = tiny_unet()
    compiled = tc.compile(unet, cache_dir=False)
    pipe = pipeline(compiled)
    expected = generate(pipeline(unet), guidance_scale=2.0)
    assert same(generate(pipe, guidance_scale=2.0).images, expected.images)
    assert same(asyncio.run(generate_async(pipe, guidance_scale=2.0)).images, expected.images)
    info = compiled.cache_info()
    assert info.traces == 1 and info.hits == 2 * STEPS - 1 and info.fallbacks == 0


# ----- the non-finite guard -------------------------------------------------------------
def poisoned_once(positions):
    """A model hook that puts NaN at ``positions`` of the first output only (an infinite
    output would be clipped to a huge finite value, which the next UNet call turns into
    more non-finite values: the guard counts those too, so NaN keeps the count exact)."""
    def hook(index, out):
        if index != 0:
            return out
        values = out.numpy().copy()
        values.reshape(-1)[positions] = np.nan
        return tc.tensor(values, device=out.device)
    return hook


def test_nan_from_the_model_is_replaced_and_counted_with_one_warning() -> None:
    pipe = pipeline(Instrumented(tiny_unet(), poisoned_once([3, 17, 40, 99])))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = generate(pipe)
    messages = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "4 non-finite" in str(messages[0].message)
    assert result.nonfinite_count == 4
    assert np.isfinite(result.images.numpy()).all()
    clean = pipeline(Instrumented(tiny_unet()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert generate(clean).nonfinite_count == 0


def test_nan_guard_under_async_warns_once() -> None:
    pipe = pipeline(Instrumented(tiny_unet(), poisoned_once([5])))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = asyncio.run(generate_async(pipe))
    assert result.nonfinite_count == 1
    assert sum(issubclass(w.category, RuntimeWarning) for w in caught) == 1


def test_guard_replaces_like_nan_to_num(backend) -> None:
    from diffusion.pipelines import NonFiniteGuard

    values = np.array([[1.5, np.nan], [np.inf, -np.inf]], np.float32)
    guard = NonFiniteGuard()
    out = guard(tc.tensor(values))
    assert same(out, np.nan_to_num(values))
    guard(tc.tensor(values))
    assert guard.count() == 6


# ----- classifier-free guidance against hand-written loops ----------------------------------
def hand_loop(unet, scheduler, latents, labels, scale=None, null=NUM_CLASSES):
    """DDIM sampling written out: the batched [uncond, cond] call when ``scale`` is given."""
    run = scheduler.start(STEPS)
    x = latents
    with tc.no_grad():
        for t in run.schedule:
            t = int(t)
            if scale is None:
                eps = unet(x, t, class_labels=tc.tensor(labels))
            else:
                both = unet(tc.cat([x, x]), t, class_labels=tc.tensor([null] * len(labels) + list(labels)))
                uncond, cond = both.chunk(2)
                eps = uncond + (cond - uncond) * scale
            x = run.step(eps, t, x).prev_sample
    return (x * 0.5 + 0.5).clip(0.0, 1.0)


def test_guidance_scale_one_equals_the_unguided_loop_and_guidance_equals_the_batched_cfg_loop() -> None:
    unet, scheduler = tiny_unet(), DDIMScheduler()
    pipe = pipeline(unet, scheduler)
    latents = tc.tensor(np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype(np.float32))
    unguided = generate(pipe, latents=latents, guidance_scale=1.0)
    assert same(unguided.images, hand_loop(unet, scheduler, latents, [0, 2]))
    assert same(unguided.images, generate(pipe, latents=latents).images)
    guided = generate(pipe, latents=latents, guidance_scale=3.0)
    np.testing.assert_allclose(guided.images.numpy(), hand_loop(unet, scheduler, latents, [0, 2], 3.0).numpy(),
                               rtol=0, atol=1e-6)
    assert not np.allclose(guided.images.numpy(), unguided.images.numpy(), atol=1e-4)


def test_context_guidance_uses_the_negative_context() -> None:
    unet = tiny_unet(classes=None, cross_attention_dim=6)
    pipe = DiffusionPipeline(unet, DDIMScheduler())
    context = tc.tensor(np.random.default_rng(1).standard_normal((2, 3, 6)).astype(np.float32))
    base = dict(batch_size=2, num_inference_steps=STEPS, seed=0, progress=False, context=context)
    plain = pipe.generate(**base, guidance_scale=2.0)
    zeros = pipe.generate(**base, guidance_scale=2.0, negative_context=tc.zeros(2, 3, 6))
    other = pipe.generate(**base, guidance_scale=2.0, negative_context=context * 0.5)
    assert same(plain.images, zeros.images)
    assert not same(plain.images, other.images)


# ----- outputs, callbacks, folders ---------------------------------------------------------
def test_output_types_and_the_callback() -> None:
    pipe = pipeline()
    tensor = generate(pipe).images
    array = generate(pipe, output="numpy").images
    assert array.shape == (2, 8, 8, 1) and array.dtype == np.float32
    np.testing.assert_array_equal(array, tensor.numpy().transpose(0, 2, 3, 1))
    images = generate(pipe, output="pil").images
    assert [im.size for im in images] == [(8, 8), (8, 8)] and images[0].mode == "L"
    seen = []
    stopped = generate(pipe, callback=lambda step, t, sample: seen.append((step, t, sample.shape)) or step < 1)
    assert stopped.steps_run == 2
    assert [s for s, _, _ in seen] == [0, 1] and seen[0][2] == (2, 1, 8, 8)
    assert seen[0][1] > seen[1][1]


def test_pipeline_folder_round_trip(tmp_path) -> None:
    pipe = pipeline()
    pipe.save_pretrained(tmp_path / "pipe")
    loaded = DiffusionPipeline.from_pretrained(str(tmp_path / "pipe"))
    assert isinstance(loaded.scheduler, DDIMScheduler) and loaded.null_class_label == NUM_CLASSES
    assert same(generate(loaded).images, generate(pipe).images)
    with pytest.raises(ValueError, match="LatentDiffusionPipeline"):
        LatentDiffusionPipeline.from_pretrained(str(tmp_path / "pipe"))


def test_latent_pipeline_decodes_and_matches_async(tmp_path) -> None:
    vae = tiny_vae()
    unet = tiny_unet(in_channels=2)
    pipe = LatentDiffusionPipeline(vae, unet, DDIMScheduler(), null_class_label=NUM_CLASSES)
    result = generate(pipe, guidance_scale=2.0)
    assert result.images.shape == (2, 1, 16, 16)
    assert same(asyncio.run(generate_async(pipe, guidance_scale=2.0)).images, result.images)
    latents = tc.tensor(np.random.default_rng(2).standard_normal((2, 2, 8, 8)).astype(np.float32))
    run = DDIMScheduler().start(STEPS)
    x = latents
    with tc.no_grad():
        for t in run.schedule:
            x = run.step(unet(x, int(t), class_labels=tc.tensor([0, 2])), int(t), x).prev_sample
        expected = (vae.decode(x * (1 / vae.config["scaling_factor"])) * 0.5 + 0.5).clip(0, 1)
    assert same(generate(pipe, latents=latents).images, expected)
    pipe.save_pretrained(tmp_path / "latent")
    loaded = LatentDiffusionPipeline.from_pretrained(str(tmp_path / "latent"))
    assert same(generate(loaded, latents=latents).images, expected)


# ----- bad input ---------------------------------------------------------------------------
BAD_CALLS = [
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(num_inference_steps=0), ValueError, "num_inference_steps"),
    (dict(num_inference_steps=1001), ValueError, "num_inference_steps"),
    (dict(guidance_scale=-1.0), ValueError, "guidance_scale"),
    (dict(class_labels=[0, 7]), ValueError, "class_labels"),
    (dict(class_labels=[0, 1, 2]), ValueError, "class_labels"),
    (dict(class_labels=[0.5, 1]), TypeError, "class_labels"),
    (dict(latents=tc.zeros(2, 1, 7, 8)), ValueError, "latents"),
    (dict(latents=tc.zeros(2, 2, 8, 8)), ValueError, "latents"),
    (dict(latents=tc.zeros(3, 1, 8, 8)), ValueError, "latents"),
    (dict(eta=-0.1), ValueError, "eta"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(generator=tc.Generator(seed=1)), ValueError, "seed or generator"),
    (dict(output="jpeg"), ValueError, "output"),
    (dict(context=tc.zeros(2, 3, 4)), ValueError, "context"),
    (dict(callback=5), TypeError, "callback"),
]


@pytest.mark.parametrize("kwargs, error, name", BAD_CALLS, ids=[n for _, _, n in BAD_CALLS])
def test_bad_arguments_raise_before_any_work(kwargs, error, name) -> None:
    unet = Instrumented(tiny_unet())
    pipe = pipeline(unet)
    with pytest.raises(error, match=name):
        generate(pipe, **kwargs)
    with pytest.raises(error, match=name):
        asyncio.run(generate_async(pipe, **kwargs))
    assert unet.calls == 0


def test_guidance_needs_conditioning_and_a_null_label() -> None:
    unconditional = DiffusionPipeline(tiny_unet(classes=None), DDIMScheduler())
    with pytest.raises(ValueError, match="guidance_scale"):
        unconditional.generate(guidance_scale=2.0, progress=False)
    no_null = DiffusionPipeline(tiny_unet(), DDIMScheduler())
    with pytest.raises(ValueError, match="null_class_label"):
        no_null.generate(batch_size=2, class_labels=[0, 1], guidance_scale=2.0, progress=False)
    with pytest.raises(ValueError, match="class_labels"):
        no_null.generate(progress=False)
    with pytest.raises(ValueError, match="eta"):
        pipeline(scheduler=DDPMScheduler()).generate(batch_size=2, class_labels=[0, 1], eta=0.5, progress=False)
    with pytest.raises(ValueError, match="null_class_label"):
        DiffusionPipeline(tiny_unet(), DDIMScheduler(), null_class_label=9)
    with pytest.raises(TypeError, match="scheduler"):
        DiffusionPipeline(tiny_unet(), object())


@pytest.mark.gpu
def test_mismatched_devices_raise() -> None:
    pipe = pipeline()
    with pytest.raises(ValueError, match="latents"):
        generate(pipe, latents=tc.zeros(2, 1, 8, 8, device="cuda"))
    with pytest.raises(ValueError, match="VAE"):
        LatentDiffusionPipeline(tiny_vae().to("cuda"), tiny_unet(in_channels=2), DDIMScheduler())


# ----- against diffusers -------------------------------------------------------------------
def test_ddim_loop_matches_diffusers_on_the_same_weights(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    unet = tiny_unet(classes=None)
    with tc.no_grad():
        for i, p in enumerate(unet.parameters()):  # move every weight off its initial value
            p += tc.tensor(np.random.default_rng(i).standard_normal(p.shape).astype(np.float32) * 0.05)
    unet.save_pretrained(tmp_path / "unet")
    theirs = diffusers.UNet2DModel.from_pretrained(tmp_path / "unet").eval()
    config = dict(beta_schedule="squaredcos_cap_v2", clip_sample=True)
    scheduler = diffusers.DDIMScheduler(**config)
    scheduler.set_timesteps(10)
    noise = np.random.default_rng(5).standard_normal((2, 1, 8, 8)).astype(np.float32)
    x = torch.tensor(noise)
    with torch.no_grad():
        for t in scheduler.timesteps:
            x = scheduler.step(theirs(x, t).sample, t, x, eta=0.0).prev_sample
    expected = (x / 2 + 0.5).clamp(0, 1).numpy()
    pipe = DiffusionPipeline(unet, DDIMScheduler(**config))
    ours = pipe.generate(batch_size=2, num_inference_steps=10, latents=tc.tensor(noise), progress=False)
    np.testing.assert_allclose(ours.images.numpy(), expected, rtol=0, atol=2e-5)
