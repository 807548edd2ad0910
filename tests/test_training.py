"""train_ddpm / train_vae: the loss falls, resume equals an uninterrupted run bit for bit,
a kill while a checkpoint is written leaves the previous one loadable, trained samples
are closer to the data than noise; EMA and the LR schedule against their oracles."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import tensorcore as tc
from diffusion import DDIMScheduler, DDPMScheduler
from diffusion.datasets import digit_images
from diffusion.pipelines import DiffusionPipeline
from diffusion.training import (EMAModel, latent_scaling_factor, latest_checkpoint, list_checkpoints,
                                load_checkpoint, train_ddpm, train_vae, warmup_cosine)
from diffusion.training.metrics import read_metrics_rows
from optim import AdamW
from pipeline_helpers import NUM_CLASSES, same, tiny_unet, tiny_vae

REPO = Path(__file__).resolve().parents[1]


def digits_subset(size: int = 8, count: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` digits of classes 0..NUM_CLASSES-1."""
    images, labels = digit_images(size)
    keep = np.flatnonzero(labels < NUM_CLASSES)[:count]
    return images[keep], labels[keep]


def scheduler() -> DDPMScheduler:
    return DDPMScheduler(beta_schedule="squaredcos_cap_v2")


QUICK = dict(batch_size=16, lr=3e-3, warmup_steps=2, progress=False, log_every=1)


# ----- the loss falls ---------------------------------------------------------------------
def test_a_short_run_lowers_the_loss(tmp_path) -> None:
    result = train_ddpm(tiny_unet().train(), scheduler(), digits_subset(), steps=60,
                        **{**QUICK, "batch_size": 32, "warmup_steps": 5, "log_every": 10}, out_dir=str(tmp_path))
    assert result.step == 60 and len(result.losses) == 6
    assert result.losses[-1] < 0.6 * result.losses[0], result.losses
    rows = read_metrics_rows(tmp_path / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [10, 20, 30, 40, 50, 60]
    assert all(float(r["grad_norm"]) > 0 and float(r["lr"]) > 0 for r in rows)
    with Image.open(tmp_path / "loss.png") as image:
        image.verify()
    assert [step for step, _ in list_checkpoints(tmp_path / "checkpoints")] == [60]


@pytest.mark.parametrize("prediction_type", ["v_prediction", "sample"])
def test_other_prediction_types_train(prediction_type) -> None:
    sched = DDPMScheduler(beta_schedule="squaredcos_cap_v2", prediction_type=prediction_type)
    result = train_ddpm(tiny_unet().train(), sched, digits_subset(), steps=30,
                        **{**QUICK, "batch_size": 32, "log_every": 10})
    assert result.losses[-1] < result.losses[0]


def test_train_vae_lowers_the_loss_and_measures_a_scaling_factor() -> None:
    images, _ = digits_subset(size=16)
    vae = tiny_vae().train()
    result = train_vae(vae, images, steps=30, **{**QUICK, "log_every": 10})
    assert result.losses[-1] < 0.7 * result.losses[0], result.losses
    factor = latent_scaling_factor(vae.eval(), images)
    with tc.no_grad():
        means = vae.encode(tc.tensor(images)).mean.numpy().astype(np.float64)
    assert factor == pytest.approx(1 / means.std(), rel=1e-5)


# ----- exact resume and checkpoints ----------------------------------------------------------
def _state(result, unet) -> dict[str, np.ndarray]:
    arrays = {f"p{i}": p.numpy() for i, p in enumerate(unet.parameters())}
    arrays.update({f"e{i}": s.numpy() for i, s in enumerate(result.ema.shadow_params)})
    return arrays


def test_resume_equals_the_uninterrupted_run_bit_for_bit(tmp_path) -> None:
    options = dict(steps=8, checkpoint_every=4, **QUICK, label_dropout=0.2)
    with tc.use_backend("numpy"):
        whole_unet = tiny_unet().train()
        whole = train_ddpm(whole_unet, scheduler(), digits_subset(), out_dir=str(tmp_path / "whole"), **options)
        part_unet = tiny_unet().train()
        first = train_ddpm(part_unet, scheduler(), digits_subset(), out_dir=str(tmp_path / "part"),
                           callback=lambda step: step < 4, **options)
        assert first.step == 4
        resumed_unet = tiny_unet(seed=7).train()  # other initial weights: the checkpoint must replace them
        rest = train_ddpm(resumed_unet, scheduler(), digits_subset(), out_dir=str(tmp_path / "part"),
                          resume=True, **options)
    assert rest.step == 8
    expected, actual = _state(whole, whole_unet), _state(rest, resumed_unet)
    assert expected.keys() == actual.keys()
    assert all(same(expected[k], actual[k]) for k in expected)
    assert whole.losses[4:] == rest.losses
    final_whole, final_part = (load_checkpoint(tmp_path / run / "checkpoints" / "step-0000008.safetensors")
                               for run in ("whole", "part"))
    for key, entry in final_whole.optimizer["state"].items():
        assert all(same(value, final_part.optimizer["state"][key][role]) for role, value in entry.items())
    assert same(final_whole.rng_noise, final_part.rng_noise)
    assert final_whole.data["offset"] == final_part.data["offset"]
    columns = ("step", "loss", "lr", "grad_norm")
    rows = [[{c: r[c] for c in columns} for r in read_metrics_rows(tmp_path / run / "metrics.csv")]
            for run in ("whole", "part")]
    assert rows[0] == rows[1]


def test_checkpoints_round_trip_and_bad_files_raise(tmp_path) -> None:
    unet = tiny_unet().train()
    result = train_ddpm(unet, scheduler(), digits_subset(), steps=3, checkpoint_every=1, keep_checkpoints=2,
                        out_dir=str(tmp_path), **QUICK)
    assert [step for step, _ in list_checkpoints(tmp_path / "checkpoints")] == [2, 3]
    checkpoint = load_checkpoint(result.checkpoint)
    assert checkpoint.step == 3 and checkpoint.config["kind"] == "ddpm"
    assert checkpoint.config["null_class_label"] == NUM_CLASSES
    assert all(same(checkpoint.model[k], v) for k, v in unet.state_dict().items())
    assert all(same(a, b) for a, b in zip(checkpoint.ema, result.ema.shadow_params))
    not_a_checkpoint = tmp_path / "weights.safetensors"
    unet.save(str(not_a_checkpoint))
    with pytest.raises(ValueError, match="not a training checkpoint"):
        load_checkpoint(not_a_checkpoint)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(Path(result.checkpoint).read_bytes()[:1000])
    with pytest.raises(ValueError):
        load_checkpoint(truncated)
    with pytest.raises(ValueError, match="'ddpm' checkpoint"):
        train_vae(tiny_vae(), digits_subset(16)[0], steps=4, resume=result.checkpoint, **QUICK)


def test_a_kill_while_writing_a_checkpoint_leaves_the_previous_one_loadable(tmp_path) -> None:
    marker = tmp_path / "writing"
    child = textwrap.dedent(f"""
        import os, sys, time
        sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'tests')!r}]
        from diffusion import DDPMScheduler
        from diffusion.training import train_ddpm
        from pipeline_helpers import tiny_unet
        from test_training import digits_subset

        def arm(step):
            if step == 2:  # checkpoint 2 is on disk; block inside the write of checkpoint 4
                def stall(fd):
                    open({str(marker)!r}, "w").close()
                    time.sleep(600)
                os.fsync = stall
        train_ddpm(tiny_unet().train(), DDPMScheduler(), digits_subset(), steps=6, checkpoint_every=2,
                   batch_size=16, progress=False, out_dir={str(tmp_path)!r}, callback=arm)
    """)
    process = subprocess.Popen([sys.executable, "-c", child], env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert process.poll() is None, "the training process ended before writing checkpoint 4"
            assert time.monotonic() < deadline, "checkpoint 4 was never written"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    folder = tmp_path / "checkpoints"
    assert any(name.endswith(".tmp") for name in os.listdir(folder))  # the write that was cut short
    assert latest_checkpoint(folder).endswith("step-0000002.safetensors")
    assert load_checkpoint(latest_checkpoint(folder)).step == 2
    resumed = train_ddpm(tiny_unet().train(), DDPMScheduler(), digits_subset(), steps=4, checkpoint_every=2,
                         batch_size=16, progress=False, out_dir=str(tmp_path), resume=True)
    assert resumed.step == 4
    assert not any(name.endswith(".tmp") for name in os.listdir(folder))


# ----- samples of a trained model ----------------------------------------------------------
def nearest_distances(samples: np.ndarray, data: np.ndarray) -> np.ndarray:
    flat_s, flat_d = samples.reshape(len(samples), -1), data.reshape(len(data), -1)
    squared = (flat_s ** 2).sum(1)[:, None] - 2 * flat_s @ flat_d.T + (flat_d ** 2).sum(1)[None]
    return np.sqrt(np.maximum(squared, 0).min(axis=1))


def samples_against_noise(steps: int, batch_size: int, lr: float) -> tuple[float, float]:
    """Train on the digits subset, sample, and return the mean nearest-neighbour distance
    of the samples and of the starting noise to the training images (both in [-1, 1])."""
    images, labels = digits_subset(count=512)
    unet = tiny_unet().train()
    sched = scheduler()
    result = train_ddpm(unet, sched, (images, labels), steps=steps, batch_size=batch_size, lr=lr,
                        warmup_steps=20, log_every=50, progress=False)
    result.ema.copy_to(unet.parameters())
    pipe = DiffusionPipeline(unet.eval(), DDIMScheduler.from_config(sched.config), null_class_label=NUM_CLASSES)
    noise = np.random.default_rng(0).standard_normal((12, 1, 8, 8)).astype(np.float32)
    out = pipe.generate(batch_size=12, num_inference_steps=20, latents=tc.tensor(noise),
                        class_labels=np.arange(12) % NUM_CLASSES, guidance_scale=2.0, progress=False)
    samples = out.images.numpy() * 2 - 1
    return nearest_distances(samples, images).mean(), nearest_distances(np.clip(noise, -1, 1), images).mean()


def test_trained_samples_are_closer_to_the_data_than_noise() -> None:
    sample_distance, noise_distance = samples_against_noise(steps=150, batch_size=32, lr=5e-3)
    assert sample_distance < 0.85 * noise_distance, (sample_distance, noise_distance)


@pytest.mark.slow
def test_longer_training_gives_samples_near_the_data() -> None:
    # 800 steps: 0.31 of the noise's distance here (1500 steps: 0.30)
    sample_distance, noise_distance = samples_against_noise(steps=800, batch_size=64, lr=3e-3)
    assert sample_distance < 0.4 * noise_distance, (sample_distance, noise_distance)


# ----- EMA and the learning-rate schedule against their oracles --------------------------------
def test_ema_matches_diffusers_ema_model() -> None:
    torch = pytest.importorskip("torch")
    training_utils = pytest.importorskip("diffusers.training_utils")
    rng = np.random.default_rng(0)
    start = [rng.standard_normal((3, 4)), rng.standard_normal(5)]
    ours = [tc.tensor(a, dtype=tc.float64, requires_grad=True) for a in start]
    theirs = [torch.nn.Parameter(torch.tensor(a)) for a in start]
    for options in (dict(decay=0.99), dict(decay=0.999, use_ema_warmup=True, power=0.75, update_after_step=2)):
        ema, reference = EMAModel(ours, **options), training_utils.EMAModel(theirs, **options)
        for _ in range(12):
            moves = [rng.standard_normal(a.shape) for a in start]
            with tc.no_grad():
                for p, m in zip(ours, moves):
                    p += tc.tensor(m)
            with torch.no_grad():
                for p, m in zip(theirs, moves):
                    p += torch.tensor(m)
            ema.step(ours)
            reference.step(theirs)
        for mine, expected in zip(ema.shadow_params, reference.shadow_params):
            np.testing.assert_allclose(mine.numpy(), expected.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before:UserWarning")  # no optimizer steps here
def test_warmup_cosine_matches_torch_schedulers() -> None:
    torch = pytest.importorskip("torch")
    ours_opt = AdamW([tc.zeros(2, requires_grad=True)], lr=0.01)
    schedule = warmup_cosine(ours_opt, warmup_steps=5, total_steps=20, min_lr=1e-4)
    their_opt = torch.optim.AdamW([torch.zeros(2, requires_grad=True)], lr=0.01)
    warmup = torch.optim.lr_scheduler.LinearLR(their_opt, start_factor=1 / 5, total_iters=5)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(their_opt, T_max=15, eta_min=1e-4)
    reference = torch.optim.lr_scheduler.SequentialLR(their_opt, [warmup, cosine], milestones=[5])
    for step in range(21):
        assert schedule.get_last_lr()[0] == pytest.approx(reference.get_last_lr()[0], rel=1e-9, abs=1e-12)
        if step < 20:
            schedule.step()
            reference.step()
    assert math.isclose(ours_opt.param_groups[0]["lr"], 1e-4, rel_tol=1e-9)


# ----- bad options --------------------------------------------------------------------------
@pytest.mark.parametrize("options, match", [
    (dict(steps=0), "steps"), (dict(lr=0.0), "lr"), (dict(batch_size=10_000), "batch_size"),
    (dict(ema_decay=1.0), "ema_decay"), (dict(grad_clip=-1.0), "grad_clip"), (dict(resume=True), "out_dir"),
    (dict(label_dropout=1.0), "label_dropout"), (dict(null_class_label=9), "null_class_label"),
    (dict(resume="/nonexistent/checkpoint"), "does not exist"),
])
def test_bad_options_raise_before_training(options, match) -> None:
    unet = tiny_unet().train()
    before = [p.numpy().copy() for p in unet.parameters()]
    with pytest.raises(ValueError, match=match):
        train_ddpm(unet, scheduler(), digits_subset(), **{"steps": 2, "progress": False, **options})
    assert all(same(a, p) for a, p in zip(before, unet.parameters()))


def test_bad_data_raises() -> None:
    images, labels = digits_subset()
    with pytest.raises(TypeError, match="unknown options"):
        train_ddpm(tiny_unet(), scheduler(), (images, labels), step=3)
    with pytest.raises(ValueError, match="labels must lie"):
        train_ddpm(tiny_unet(), scheduler(), (images, labels + NUM_CLASSES))
    with pytest.raises(ValueError, match="class-conditioned"):
        train_ddpm(tiny_unet(), scheduler(), images)
    with pytest.raises(ValueError, match="no class embedding"):
        train_ddpm(tiny_unet(classes=None), scheduler(), (images, labels))
    with pytest.raises(ValueError, match="images must be"):
        train_ddpm(tiny_unet(), scheduler(), (images[:, 0], labels))
    with pytest.raises(ValueError, match="kl_weight"):
        train_vae(tiny_vae(), images, kl_weight=-1.0)


@pytest.mark.gpu
def test_generator_state_round_trips_on_the_gpu() -> None:
    generator = tc.Generator("cuda", seed=3)
    tc.randn(10, generator=generator, device="cuda")
    state = generator.get_state()
    first = tc.randn(10, generator=generator, device="cuda").numpy()
    other = tc.Generator("cuda", seed=99)
    other.set_state(state)
    assert same(tc.randn(10, generator=other, device="cuda").numpy(), first)
