"""Stable Diffusion pipelines against diffusers' own, on the same tiny random folders.

Both sides load one folder that diffusers wrote; prompts, negative prompts, guidance and
the starting latents are the same, and the images must agree within 2e-3 (float32, CPU).
Where a scheduler or the image-to-image start draws noise, diffusers' draws are replaced
by the very values our generator gives (``injected_noise``), so those runs compare exactly too.
"""

from __future__ import annotations

import asyncio
from collections import deque

import numpy as np
import pytest

import tensorcore as tc
from diffusion import (DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler, LCMScheduler, PNDMScheduler,
                       StableDiffusionImg2ImgPipeline, StableDiffusionPipeline, StableDiffusionXLPipeline,
                       UniPCMultistepScheduler)

from sd_folders import sd_folder, xl_folder

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
pytest.importorskip("transformers")

PROMPTS = ["a photo of a cat", "an astronaut riding a horse on the moon"]
NEGATIVE = ["blurry", "low quality, ugly"]
BOUND = 2e-3


def pipelines(folder, kind: str) -> tuple:
    """(folder, diffusers' pipeline, ours, eager) of one kind ("StableDiffusionPipeline", ...)."""
    theirs = getattr(diffusers, kind).from_pretrained(folder)
    theirs.set_progress_bar_config(disable=True)
    ours = {"StableDiffusionPipeline": StableDiffusionPipeline, "StableDiffusionXLPipeline": StableDiffusionXLPipeline,
            "StableDiffusionImg2ImgPipeline": StableDiffusionImg2ImgPipeline}[kind]
    return folder, theirs, ours.from_pretrained(folder, compile=False)


@pytest.fixture(scope="module")
def sd(tmp_path_factory):
    return pipelines(sd_folder(tmp_path_factory.mktemp("sd")), "StableDiffusionPipeline")


@pytest.fixture(scope="module")
def xl(tmp_path_factory):
    return pipelines(xl_folder(tmp_path_factory.mktemp("xl")), "StableDiffusionXLPipeline")


def latents(batch: int, seed: int = 0, size: int = 8) -> tuple:
    x = np.random.default_rng(seed).standard_normal((batch, 4, size, size)).astype(np.float32)
    return torch.from_numpy(x.copy()), tc.tensor(x)


def injected_noise(monkeypatch, seed: int, modules: list[str]):
    """Make diffusers' ``randn_tensor`` in ``modules`` return what ``tc.Generator("cpu", seed)``
    draws for the same shapes, in order (our pipeline draws from that generator with ``seed``)."""
    import importlib

    generator = tc.Generator("cpu", seed)

    def randn_tensor(shape, generator_=None, device=None, dtype=None, layout=None, **_):
        drawn = tc.randn(*shape, generator=generator).numpy()
        return torch.from_numpy(drawn.copy()).to(dtype=dtype or torch.float32)

    for name in modules:
        monkeypatch.setattr(importlib.import_module(name), "randn_tensor", randn_tensor)


def assert_images_match(theirs, ours, bound: float = BOUND) -> None:
    theirs, ours = np.asarray(theirs), np.asarray(ours)
    assert theirs.shape == ours.shape
    assert np.isfinite(ours).all()
    assert np.abs(theirs - ours).max() <= bound, np.abs(theirs - ours).max()


def both(pair, scheduler=None, seed: int = 0, **kwargs):
    """(diffusers' images, ours) for one call with the same starting latents."""
    _, theirs, ours = pair
    batch = (len(kwargs["prompt"]) if isinstance(kwargs.get("prompt"), list) else 1) \
        * kwargs.get("num_images_per_prompt", 1)
    if "prompt_embeds" in kwargs:
        batch = kwargs["prompt_embeds"][0].shape[0] * kwargs.get("num_images_per_prompt", 1)
    t_latents, o_latents = latents(batch, seed)
    ours_kwargs = {k: (v[1] if isinstance(v, tuple) and k.endswith("embeds") else v) for k, v in kwargs.items()}
    theirs_kwargs = {k: (v[0] if isinstance(v, tuple) and k.endswith("embeds") else v) for k, v in kwargs.items()}
    if scheduler is not None:
        theirs.scheduler, ours.scheduler = scheduler
    want = theirs(latents=t_latents, output_type="np", **theirs_kwargs).images
    got = ours(latents=o_latents, output_type="np", progress=False, seed=seed, **ours_kwargs).images
    return want, got


def swapped(pair, theirs_cls: str, ours_cls, **config):
    """Both pipelines' schedulers swapped through ``from_config`` of their current configs."""
    _, theirs, ours = pair
    return (getattr(diffusers, theirs_cls).from_config(theirs.scheduler.config, **config),
            ours_cls.from_config(ours.scheduler.config, **config))


@pytest.fixture
def restore(sd):
    """Put the folder's scheduler back after a test that swaps it."""
    _, theirs, ours = sd
    kept = theirs.scheduler, ours.scheduler
    yield
    theirs.scheduler, ours.scheduler = kept


# ----- text to image ----------------------------------------------------------------------------------
def test_ddim_with_prompts_and_negative_prompts_matches_diffusers(sd) -> None:
    want, got = both(sd, prompt=PROMPTS, negative_prompt=NEGATIVE, num_inference_steps=4, guidance_scale=7.5)
    assert_images_match(want, got)


@pytest.mark.parametrize("name, ours_cls, config", [
    ("DPMSolverMultistepScheduler", DPMSolverMultistepScheduler, {"use_karras_sigmas": True}),
    ("PNDMScheduler", PNDMScheduler, {"skip_prk_steps": True}),
    ("UniPCMultistepScheduler", UniPCMultistepScheduler, {}),
])
def test_deterministic_schedulers_swapped_in_through_from_config_match_diffusers(sd, restore, name, ours_cls,
                                                                                  config) -> None:
    want, got = both(sd, swapped(sd, name, ours_cls, **config), prompt=PROMPTS[0], num_inference_steps=5)
    assert_images_match(want, got)


def test_euler_ancestral_with_the_same_noise_matches_diffusers(sd, restore, monkeypatch) -> None:
    injected_noise(monkeypatch, 7, ["diffusers.schedulers.scheduling_euler_ancestral_discrete"])
    want, got = both(sd, swapped(sd, "EulerAncestralDiscreteScheduler", EulerAncestralDiscreteScheduler), seed=7,
                     prompt=PROMPTS[1], num_inference_steps=4)
    assert_images_match(want, got)


def final_norm_where_diffusers_looks(pipe) -> None:
    """diffusers reads ``text_encoder.text_model.final_layer_norm`` for ``clip_skip``; transformers 5
    keeps it on the model itself, so point the old name at it (outside torch's module tree)."""
    from types import SimpleNamespace

    for encoder in (getattr(pipe, "text_encoder", None), getattr(pipe, "text_encoder_2", None)):
        if encoder is not None and not hasattr(encoder, "text_model"):
            object.__setattr__(encoder, "text_model", SimpleNamespace(final_layer_norm=encoder.final_layer_norm))


def test_clip_skip_guidance_rescale_and_images_per_prompt_match_diffusers(sd) -> None:
    final_norm_where_diffusers_looks(sd[1])
    want, got = both(sd, prompt=PROMPTS, num_inference_steps=3, clip_skip=1, guidance_rescale=0.7,
                     num_images_per_prompt=2)
    assert_images_match(want, got)
    assert got.shape == (4, 16, 16, 3)


def test_prompt_embeds_passed_directly_match_diffusers(sd) -> None:
    _, theirs, ours = sd
    rng = np.random.default_rng(3)
    embeds = rng.standard_normal((2, 77, 32)).astype(np.float32)
    negative = rng.standard_normal((2, 77, 32)).astype(np.float32)
    want, got = both(sd, prompt_embeds=(torch.from_numpy(embeds), tc.tensor(embeds)),
                     negative_prompt_embeds=(torch.from_numpy(negative), tc.tensor(negative)), num_inference_steps=3)
    assert_images_match(want, got)


def test_lcm_with_its_guidance_embedding_matches_diffusers(tmp_path, monkeypatch) -> None:
    folder = sd_folder(tmp_path / "lcm", lcm=True)
    theirs = diffusers.StableDiffusionPipeline.from_pretrained(folder)
    theirs.scheduler = diffusers.LCMScheduler.from_config(theirs.scheduler.config)
    theirs.set_progress_bar_config(disable=True)
    ours = StableDiffusionPipeline.from_pretrained(folder, compile=False, scheduler=LCMScheduler)
    injected_noise(monkeypatch, 5, ["diffusers.schedulers.scheduling_lcm"])
    want, got = both((folder, theirs, ours), seed=5, prompt=PROMPTS[0], num_inference_steps=4, guidance_scale=6.0)
    assert_images_match(want, got)


# ----- image to image ---------------------------------------------------------------------------------
@pytest.mark.parametrize("strength", [0.5, 0.9])
def test_image_to_image_matches_diffusers(sd, monkeypatch, strength) -> None:
    _, theirs, ours = pipelines(sd[0], "StableDiffusionImg2ImgPipeline")
    injected_noise(monkeypatch, 11, ["diffusers.models.autoencoders.vae",
                                     "diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion_img2img"])
    image = np.random.default_rng(1).uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)
    want = theirs(PROMPTS[0], image=torch.from_numpy(image), strength=strength, num_inference_steps=6,
                  output_type="np").images
    got = ours(PROMPTS[0], image=tc.tensor(image), strength=strength, num_inference_steps=6, output_type="np",
               seed=11, progress=False).images
    assert_images_match(want, got)


def test_image_to_image_takes_pil_images_and_refuses_no_steps(sd) -> None:
    from PIL import Image

    folder, _, _ = sd
    ours = StableDiffusionImg2ImgPipeline.from_pretrained(folder, compile=False)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (21, 19, 3), dtype=np.uint8))
    out = ours("a cat", image=image, strength=0.5, num_inference_steps=2, seed=0, progress=False)
    assert out.images[0].size == (18, 20)  # cut down to multiples of the VAE's scale
    with pytest.raises(ValueError, match="leaves no step"):
        ours("a cat", image=image, strength=0.1, num_inference_steps=2)


# ----- SDXL ---------------------------------------------------------------------------------------------
def test_sdxl_with_two_encoders_and_time_ids_matches_diffusers(xl) -> None:
    want, got = both(xl, prompt=PROMPTS, prompt_2=["oil painting", "pencil sketch"], negative_prompt="blurry",
                     num_inference_steps=3, original_size=(32, 24), crops_coords_top_left=(2, 1))
    assert_images_match(want, got)


def test_generate_is_each_pipelines_own_call(xl) -> None:
    _, _, ours = xl
    kwargs = dict(prompt="a cat", prompt_2="a painting", num_inference_steps=2, output_type="np", seed=3,
                  progress=False)
    np.testing.assert_array_equal(ours.generate(**kwargs).images, ours(**kwargs).images)


def test_sdxl_zeroes_an_absent_negative_prompt_and_takes_clip_skip_like_diffusers(xl) -> None:
    want, got = both(xl, prompt=PROMPTS[0], num_inference_steps=3, clip_skip=1, guidance_rescale=0.5,
                     negative_original_size=(16, 16), negative_target_size=(8, 8))
    assert_images_match(want, got)


# ----- LoRA ---------------------------------------------------------------------------------------------
def peft_lora(pipe, folder, rank: int = 4, alpha: int = 8):
    """A LoRA made with PEFT on the diffusers pipeline's UNet and text encoder, saved by diffusers."""
    peft = pytest.importorskip("peft")
    from peft.utils import get_peft_model_state_dict

    torch.manual_seed(5)
    unet_config = peft.LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights=False,
                                  target_modules=["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2",
                                                  "conv1", "conv2"])
    text_config = peft.LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights=False,
                                  target_modules=["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"])
    pipe.unet.add_adapter(unet_config, adapter_name="made")
    peft.inject_adapter_in_model(text_config, pipe.text_encoder, adapter_name="made")
    text_layers = {k.replace(".made.", "."): v for k, v in pipe.text_encoder.state_dict().items()
                   if ".lora_A.made." in k or ".lora_B.made." in k}
    diffusers.StableDiffusionPipeline.save_lora_weights(
        folder, unet_lora_layers=get_peft_model_state_dict(pipe.unet, adapter_name="made"),
        text_encoder_lora_layers=text_layers, safe_serialization=True,
        unet_lora_adapter_metadata=unet_config.to_dict(), text_encoder_lora_adapter_metadata=text_config.to_dict())
    return folder


def test_lora_images_match_diffusers_loaded_fused_and_unloaded(sd, tmp_path) -> None:
    folder, _, _ = sd
    lora = peft_lora(diffusers.StableDiffusionPipeline.from_pretrained(folder), tmp_path / "lora")
    pair = pipelines(folder, "StableDiffusionPipeline")
    _, theirs, ours = pair
    kwargs = dict(prompt=PROMPTS[0], num_inference_steps=2)
    _, base = both(pair, **kwargs)
    theirs.load_lora_weights(lora)
    ours.load_lora_weights(lora)
    want, got = both(pair, **kwargs)
    assert_images_match(want, got)
    assert np.abs(got - base).max() > 1e-2  # the LoRA changes the images
    want, got = both(pair, cross_attention_kwargs={"scale": 0.5}, **kwargs)
    assert_images_match(want, got)
    theirs.fuse_lora(lora_scale=0.7)
    ours.fuse_lora(0.7)
    want, got = both(pair, **kwargs)
    assert_images_match(want, got)
    ours.unfuse_lora()
    ours.unload_lora_weights()
    np.testing.assert_array_equal(both(pair, **kwargs)[1], base)


def test_compiled_lora_runs_the_fused_lora_kernel_and_retraces_on_fuse(sd, tmp_path) -> None:
    folder, _, _ = sd
    lora = peft_lora(diffusers.StableDiffusionPipeline.from_pretrained(folder), tmp_path / "lora")
    eager = StableDiffusionPipeline.from_pretrained(folder, compile=False)
    compiled = StableDiffusionPipeline.from_pretrained(folder, compile=True)
    for pipe in (eager, compiled):
        pipe.load_lora_weights(lora, adapter_name="style")
    kwargs = dict(prompt=PROMPTS[0], num_inference_steps=2, output_type="np", seed=0, progress=False)
    want = eager(**kwargs).images
    np.testing.assert_allclose(compiled(**kwargs).images, want, atol=1e-4)
    text_info, step_info, _ = compiled.chain.cache_info()
    assert step_info.rewrites.get("lora", 0) > 0 and text_info.rewrites.get("lora", 0) > 0
    traces = step_info.traces
    compiled.fuse_lora()
    eager.fuse_lora()
    np.testing.assert_allclose(compiled(**kwargs).images, eager(**kwargs).images, atol=1e-4)
    assert compiled.chain.cache_info()[1].traces > traces


# ----- the same images by every path ----------------------------------------------------------------
def test_compiled_equals_eager_bit_for_bit_and_async_equals_sync(sd) -> None:
    folder, _, eager = sd
    compiled = StableDiffusionPipeline.from_pretrained(folder, compile=True)
    kwargs = dict(prompt=PROMPTS, negative_prompt=NEGATIVE, num_inference_steps=3, output_type="np", progress=False)
    want = eager(seed=1, **kwargs).images
    got = compiled(seed=1, **kwargs).images
    np.testing.assert_array_equal(got, want)
    again = compiled(seed=1, **kwargs).images  # replayed plans
    np.testing.assert_array_equal(again, want)
    info = compiled.chain.cache_info()
    assert len(info) == 3 and info[1].hits > 0 and info[0].traces >= 1
    np.testing.assert_array_equal(asyncio.run(compiled.generate_async(seed=1, **kwargs)).images, want)


@pytest.mark.parametrize("compile_", [False, True])
def test_text_keys_and_values_computed_once_give_bit_identical_images(sd, compile_) -> None:
    """The cross-attention projections of the text states are hoisted out of the steps (one
    computation per generation); the images are those of projecting at every step."""
    pipe = StableDiffusionPipeline.from_pretrained(sd[0], compile=compile_)
    kwargs = dict(prompt=PROMPTS, negative_prompt=NEGATIVE, num_inference_steps=3, output_type="np", seed=4,
                  progress=False)
    pipe.hoist_text_states = False
    want = pipe(**kwargs).images
    pipe.hoist_text_states = True
    np.testing.assert_array_equal(pipe(**kwargs).images, want)
    unet, states = pipe.unet, tc.zeros(1, 77, 32)
    with pytest.raises(ValueError, match="cross_attention_kv must hold a \\(keys, values\\) pair for each of the 4"):
        unet(tc.zeros(1, 4, 8, 8), 1, states, cross_attention_kv=unet.cross_attention_kv(states)[:1])


def test_cancelling_at_a_step_leaves_the_pipeline_usable(sd) -> None:
    _, _, ours = sd
    kwargs = dict(prompt=PROMPTS[0], num_inference_steps=4, output_type="np", progress=False, seed=2)
    want = ours(**kwargs).images

    async def cancelled() -> None:
        steps: deque = deque()

        def record(pipe, step, timestep, tensors):
            steps.append(step)
            return {}

        task = asyncio.ensure_future(ours.generate_async(callback_on_step_end=record, **kwargs))
        while not steps:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    np.testing.assert_array_equal(ours(**kwargs).images, want)


def test_callback_on_step_end_sees_and_replaces_latents_and_can_interrupt(sd) -> None:
    _, _, ours = sd
    seen = []

    def callback(pipe, step, timestep, tensors):
        seen.append((step, timestep, tuple(tensors["latents"].shape), tuple(tensors["prompt_embeds"].shape)))
        if step == 1:
            pipe._interrupt = True
        return {"latents": tensors["latents"] * 0.0}

    out = ours("a cat", num_inference_steps=4, callback_on_step_end=callback, output_type="latent",
               callback_on_step_end_tensor_inputs=["latents", "prompt_embeds"], seed=0, progress=False)
    assert [s[0] for s in seen] == [0, 1] and out.steps_run == 2
    assert seen[0][2] == (1, 4, 8, 8) and seen[0][3] == (1, 77, 32)
    assert not np.any(out.images.numpy())  # the returned latents replaced the sample
    assert not ours.interrupt or ours("a cat", num_inference_steps=1, seed=0, progress=False).steps_run == 1


# ----- folders ------------------------------------------------------------------------------------------
def test_save_pretrained_writes_a_folder_diffusers_reads(sd, tmp_path) -> None:
    _, _, ours = sd
    ours.save_pretrained(tmp_path / "saved")
    theirs = diffusers.StableDiffusionPipeline.from_pretrained(tmp_path / "saved")
    theirs.set_progress_bar_config(disable=True)
    again = StableDiffusionPipeline.from_pretrained(tmp_path / "saved", compile=False)
    want, got = both((None, theirs, again), prompt="a cat", num_inference_steps=2)
    assert_images_match(want, got)


def test_folder_errors_name_the_problem(sd, tmp_path) -> None:
    import json
    import shutil

    folder, _, _ = sd
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    index = json.loads((broken / "model_index.json").read_text())
    index["scheduler"] = ["diffusers", "HeunDiscreteScheduler"]
    (broken / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="HeunDiscreteScheduler.*DDIMScheduler"):
        StableDiffusionPipeline.from_pretrained(broken)
    with pytest.warns(UserWarning, match="HeunDiscreteScheduler"):
        pipe = StableDiffusionPipeline.from_pretrained(broken, scheduler=EulerAncestralDiscreteScheduler)
    assert isinstance(pipe.scheduler, EulerAncestralDiscreteScheduler)
    index["text_encoder"] = [None, None]
    (broken / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="has no \\['text_encoder'\\]"):
        StableDiffusionPipeline.from_pretrained(broken, scheduler=EulerAncestralDiscreteScheduler)


def test_bad_calls_raise_before_any_work(sd) -> None:
    _, _, ours = sd
    cases = [
        (dict(), "exactly one of prompt and prompt_embeds"),
        (dict(prompt="a", height=13), "multiple of 2"),
        (dict(prompt="a", output_type="jpeg"), "output_type"),
        (dict(prompt="a", guidance_rescale=1.5), "guidance_rescale"),
        (dict(prompt="a", clip_skip=9), "clip_skip"),
        (dict(prompt=["a", "b"], negative_prompt=["x", "y", "z"]), "negative_prompt has 3"),
        (dict(prompt="a", cross_attention_kwargs={"foo": 1}), "cross_attention_kwargs"),
        (dict(prompt="a", latents=tc.zeros(1, 4, 4, 4)), "latents must have shape"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            ours(num_inference_steps=2, **kwargs)
