"""Pipelines with ``compile=True``: the same images as eager pipelines for the same seed,
sync and async; one plan for the whole denoising step; new weight values replay, structural
changes retrace; the VAE's compiled encode / decode follow its tiling and slicing."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest

import layers
import tensorcore as tc
from diffusion import DDIMScheduler, EulerDiscreteScheduler
from diffusion.pipelines import DiffusionPipeline, LatentDiffusionPipeline
from pipeline_helpers import NUM_CLASSES, same, tiny_unet, tiny_vae

STEPS = 4


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path):
    """Compiled pipelines use the default disk cache: keep it inside the test."""
    monkeypatch.setenv("TENSORCORE_CACHE_DIR", str(tmp_path / "cache"))


def options(**kwargs):
    return {**dict(batch_size=2, num_inference_steps=STEPS, seed=0, class_labels=[0, 2], progress=False), **kwargs}


def pixel(unet, compile, scheduler=None):  # noqa: A002
    return DiffusionPipeline(unet, scheduler or DDIMScheduler(), null_class_label=NUM_CLASSES, compile=compile)


def latent_models():
    return tiny_vae(), tiny_unet(in_channels=2)


# ----- same images ----------------------------------------------------------------------------
@pytest.mark.parametrize("case", [
    dict(scheduler=DDIMScheduler, guidance_scale=2.5, eta=0.5),
    dict(scheduler=EulerDiscreteScheduler, guidance_scale=1.0)], ids=["ddim-guided-eta", "euler"])
def test_compiled_pipeline_equals_eager_sync_and_async(backend, case):
    case = dict(case)
    scheduler = case.pop("scheduler")()
    unet = tiny_unet()
    eager, compiled = pixel(unet, False, scheduler), pixel(unet, True, scheduler)
    expected = eager.generate(**options(**case))
    assert same(compiled.generate(**options(**case)).images, expected.images)
    assert same(asyncio.run(compiled.generate_async(**options(**case))).images, expected.images)
    info = compiled.denoiser.cache_info()
    assert (info.traces, info.hits, info.fallbacks) == (1, 2 * STEPS - 1, 0)  # the whole step: one plan


def test_compiled_latent_pipeline_equals_eager_and_decodes_through_a_plan(backend):
    vae, unet = latent_models()
    eager = LatentDiffusionPipeline(vae, unet, DDIMScheduler(), null_class_label=NUM_CLASSES, compile=False)
    compiled = LatentDiffusionPipeline(vae, unet, DDIMScheduler(), null_class_label=NUM_CLASSES, compile=True)
    for guidance in (1.0, 3.0):
        expected = eager.generate(**options(guidance_scale=guidance))
        assert same(compiled.generate(**options(guidance_scale=guidance)).images, expected.images)
        assert same(asyncio.run(compiled.generate_async(**options(guidance_scale=guidance))).images,
                    expected.images)
    decode = vae.compiled("decode").cache_info()
    assert (decode.traces, decode.hits, decode.fallbacks) == (1, 3, 0)
    assert compiled.denoiser.cache_info().traces == 2  # one plan per guidance setting


def test_a_cancelled_compiled_generation_leaves_the_next_one_right():
    pipe = pixel(tiny_unet(), True)
    expected = pixel(tiny_unet(), False).generate(**options(num_inference_steps=6))

    def cancel_after_second_step(step, t, sample):
        if step == 1:
            asyncio.current_task().cancel()

    async def scenario():
        with pytest.raises(asyncio.CancelledError):
            await pipe.generate_async(**options(num_inference_steps=6, callback=cancel_after_second_step))
        return await pipe.generate_async(**options(num_inference_steps=6))

    after = asyncio.run(scenario())
    assert same(after.images, expected.images)
    # three steps (the one submitted as the cancellation arrived completes), then a full run of six
    assert pipe.denoiser.cache_info().hits == 3 + 6 - 1


# ----- what retraces ---------------------------------------------------------------------------
def test_new_weight_values_replay_and_a_replaced_parameter_retraces():
    unet = tiny_unet()
    pipe = pixel(unet, True)
    pipe.generate(**options())
    unet.load_state_dict(tiny_unet(seed=1).state_dict())  # new values, in place
    assert same(pipe.generate(**options()).images, pixel(tiny_unet(seed=1), False).generate(**options()).images)
    assert pipe.denoiser.cache_info().traces == 1
    tc.manual_seed(5)
    unet.conv_out.bias = layers.Parameter(tc.randn(*unet.conv_out.bias.shape) * 0.1)  # structure changes
    assert same(pipe.generate(**options()).images, pixel(unet, False).generate(**options()).images)
    info = pipe.denoiser.cache_info()  # a new plan: traced, or loaded from disk and bound to the new parameter
    assert info.misses == 2 and info.traces + info.disk_loads == 2 and info.fallbacks == 0


def test_compile_default_and_checks():
    unet = tiny_unet()
    assert pixel(unet, None).compile is False and pixel(unet, None).denoiser is None  # off on the CPU
    with pytest.raises(TypeError, match="compile must be True, False or None, got 'yes'"):
        pixel(unet, "yes")
    wrapped = tc.compile(unet, cache_dir=False)
    assert pixel(wrapped, None).compile is False  # a compiled UNet is called as given
    pipe = pixel(wrapped, True)  # ... unless asked: the module behind it is compiled with the combine
    assert same(pipe.generate(**options(guidance_scale=2.0)).images,
                pixel(unet, False).generate(**options(guidance_scale=2.0)).images)
    assert wrapped.cache_info().misses == 0 and pipe.denoiser.cache_info().traces == 1


def test_from_pretrained_takes_compile(tmp_path):
    vae, unet = latent_models()
    LatentDiffusionPipeline(vae, unet, DDIMScheduler(), null_class_label=NUM_CLASSES).save_pretrained(tmp_path / "p")
    loaded = LatentDiffusionPipeline.from_pretrained(str(tmp_path / "p"), compile=True)
    assert loaded.compile is True
    eager = LatentDiffusionPipeline(vae, unet, DDIMScheduler(), null_class_label=NUM_CLASSES)
    assert same(loaded.generate(**options()).images, eager.generate(**options()).images)


# ----- the VAE's compiled parts ------------------------------------------------------------------
def test_vae_compiled_decode_and_encode_follow_tiling_and_slicing(backend):
    vae = tiny_vae()
    z, x = tc.randn(2, 2, 16, 16), tc.randn(2, 1, 16, 16)
    with tc.no_grad():
        def check():
            assert same(vae.decode_compiled(z), vae.decode(z))
            assert same(vae.encode_compiled(x).mean, vae.encode(x).mean)
            assert same(vae.encode_compiled(x).std, vae.encode(x).std)

        check()
        check()  # replayed
        vae.enable_tiling(16)  # latents of 16 > tiles of 8: decoded in overlapping tiles
        check()
        vae.enable_slicing()
        check()
        vae.disable_tiling()
        vae.disable_slicing()
        check()
    for part in ("decode", "encode"):
        info = vae.compiled(part).cache_info()
        # a new plan after each flip: plain, tiled, tiled + sliced, plain again (that one may come from disk)
        assert (info.misses, info.traces + info.disk_loads, info.fallbacks) == (4, 4, 0)
        assert info.hits == (1 if part == "decode" else 2 * 5 - 4)


def test_vae_compiled_checks_and_copies():
    vae = tiny_vae()
    with pytest.raises(ValueError, match=r"AutoencoderKL.decode_compiled: expected \[B, 2, H, W\]"):
        vae.decode_compiled(tc.randn(1, 3, 8, 8))
    with pytest.raises(ValueError, match="part must be 'encode' or 'decode'"):
        vae.compiled("forward")
    z = tc.randn(1, 2, 8, 8)
    with tc.no_grad():
        first = vae.decode_compiled(z)
        twin = copy.deepcopy(vae)  # the copy gets its own plans
        assert same(twin.decode_compiled(z), first)
    assert twin.compiled("decode") is not vae.compiled("decode")
    assert "use_tiling=False" in repr(vae).splitlines()[0]


# ----- GPU -----------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_pipelines_compile_by_default_and_match_eager():
    with tc.use_backend("cupy"):
        vae, unet = (m.to("cuda") for m in latent_models())
        compiled = LatentDiffusionPipeline(vae, unet, DDIMScheduler(), null_class_label=NUM_CLASSES)
        eager = LatentDiffusionPipeline(vae, unet, DDIMScheduler(), null_class_label=NUM_CLASSES, compile=False)
        assert compiled.compile is True
        expected = eager.generate(**options(guidance_scale=2.0, eta=0.3)).images.numpy()
        for result in (compiled.generate(**options(guidance_scale=2.0, eta=0.3)),
                       asyncio.run(compiled.generate_async(**options(guidance_scale=2.0, eta=0.3)))):
            np.testing.assert_allclose(result.images.numpy(), expected, rtol=0, atol=1e-5)
    info = compiled.denoiser.cache_info()
    assert (info.traces, info.fallbacks) == (1, 0) and info.hits == 2 * STEPS - 1
