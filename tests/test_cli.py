"""``python -m diffusion``: train + sample end to end in a subprocess (tiny settings), the
latent path (train-vae, train --vae, sample-latent), and one-line errors for bad arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from diffusion import DDIMScheduler, DDPMScheduler
from diffusion.cli import build_parser, main
from diffusion.cli.commands import with_sampler
from diffusion.training import list_checkpoints, load_checkpoint

REPO = Path(__file__).resolve().parents[1]
TINY_TRAIN = ["--steps", "4", "--batch-size", "8", "--channels", "8,16", "--warmup-steps", "1", "--log-every", "2",
              "--checkpoint-every", "2", "--per-class", "1", "--sample-steps", "2", "--no-progress"]
TINY_SAMPLE = ["--per-class", "2", "--sample-steps", "2", "--no-progress"]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "diffusion", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def png_size(path: Path) -> tuple[int, int]:
    with Image.open(path) as image:
        image.load()
        return image.size


def test_train_then_sample_end_to_end(tmp_path) -> None:
    done = cli("train", *TINY_TRAIN, "--image-size", "8", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    runs = list((tmp_path / "runs").glob("train-*"))
    assert len(runs) == 1  # the default --out: runs/train-<timestamp>
    run = runs[0]
    for name in ("metrics.csv", "loss.png", "samples.png", "pipeline/model_index.json",
                 "pipeline/unet/config.json", "pipeline/unet/diffusion_pytorch_model.safetensors",
                 "pipeline/scheduler/scheduler_config.json"):
        assert (run / name).is_file(), name
    assert [step for step, _ in list_checkpoints(run / "checkpoints")] == [2, 4]
    assert f"samples: {(run / 'samples.png').relative_to(tmp_path)}" in done.stdout
    width, height = png_size(run / "samples.png")
    assert height > 10 * 8 and width > 8  # one row per digit
    assert png_size(run / "loss.png") == (640, 400)
    assert len((run / "metrics.csv").read_text().splitlines()) == 3  # header + steps 2, 4

    sampled = cli("sample", "--checkpoint", str(run), "--guidance-scale", "3", "--out", "grid", *TINY_SAMPLE,
                  cwd=tmp_path)
    assert sampled.returncode == 0, sampled.stderr
    assert png_size(tmp_path / "grid" / "samples.png")[1] == height
    newest = cli("sample", "--digits", "3,5", "--sampler", "euler", "--out", "two", *TINY_SAMPLE, cwd=tmp_path)
    assert newest.returncode == 0, newest.stderr  # the default --checkpoint: the newest run
    assert png_size(tmp_path / "two" / "samples.png")[1] < height
    from_file = cli("sample", "--checkpoint", str(run / "checkpoints" / "step-0000004.safetensors"),
                    "--out", "file", *TINY_SAMPLE, cwd=tmp_path)
    assert from_file.returncode == 0, from_file.stderr

    resumed = cli("train", "--resume", str(run / "checkpoints" / "step-0000002.safetensors"), *TINY_TRAIN,
                  cwd=tmp_path)  # the run's own options, repeated
    assert resumed.returncode == 0, resumed.stderr
    assert load_checkpoint(run / "checkpoints" / "step-0000004.safetensors").step == 4


def test_latent_commands_end_to_end(tmp_path) -> None:
    vae = cli("train-vae", "--steps", "3", "--batch-size", "8", "--channels", "8,16", "--latent-channels", "2",
              "--log-every", "1", "--no-progress", "--out", "vae_run", cwd=tmp_path)
    assert vae.returncode == 0, vae.stderr
    assert (tmp_path / "vae_run" / "vae" / "config.json").is_file()
    assert png_size(tmp_path / "vae_run" / "reconstructions.png")[0] > 0
    train = cli("train", "--vae", "vae_run/vae", *TINY_TRAIN, "--out", "latent_run", cwd=tmp_path)
    assert train.returncode == 0, train.stderr
    assert (tmp_path / "latent_run" / "pipeline" / "vae" / "config.json").is_file()
    sampled = cli("sample-latent", "--checkpoint", "latent_run", "--out", "grid", *TINY_SAMPLE, cwd=tmp_path)
    assert sampled.returncode == 0, sampled.stderr
    assert png_size(tmp_path / "grid" / "samples.png")[1] > 10 * 16
    wrong = cli("sample", "--checkpoint", "latent_run", *TINY_SAMPLE, cwd=tmp_path)
    assert wrong.returncode == 2 and "sample-latent" in wrong.stderr


BAD = [
    ["train", "--steps", "0"], ["train", "--steps", "many"], ["train", "--batch-size", "-3"],
    ["train", "--lr", "0"], ["train", "--lr", "nan"], ["train", "--image-size", "12"],
    ["train", "--channels", "8,,x"], ["train", "--ema-decay", "1.5"], ["train", "--label-dropout", "1"],
    ["train", "--prediction-type", "noise"], ["train", "--grad-clip", "-1"], ["train", "--unknown"],
    ["train", "--channels", "8,16,32,64,128", "--image-size", "8"], ["train", "--resume", "missing"],
    ["train", "--vae", "missing"], ["train-vae", "--kl-weight", "-1"], ["train-vae", "--latent-channels", "0"],
    ["sample", "--checkpoint", "missing"], ["sample", "--digits", "3-12"], ["sample", "--sample-steps", "0"],
    ["sample", "--sampler", "heun"], ["sample", "--guidance-scale", "-2"], ["sample-latent", "--per-class", "0"],
    ["sample", "--eta", "x"], ["train", "--compile", "yes"], ["train-vae", "--compile", "1"], ["bogus"], [],
]


@pytest.mark.parametrize("args", BAD, ids=[" ".join(a) or "nothing" for a in BAD])
def test_bad_arguments_exit_nonzero_with_one_line(args, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        status = main(args)
    except SystemExit as exit_:  # argparse's own checks
        status = exit_.code
    assert status not in (0, None)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0], captured.err
    assert captured.out == "" and not (tmp_path / "runs").exists()  # nothing was started


def test_a_bad_argument_in_a_subprocess(tmp_path) -> None:
    done = cli("sample", "--per-class", "0", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == ("python -m diffusion sample: error: argument --per-class: "
                                   "must be an integer >= 1, got '0'")


def test_every_option_has_a_default_and_help() -> None:
    """Every option has a help text and a default, except what ``generate`` cannot guess: the
    model folder and the prompt."""
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert set(commands) == {"train", "sample", "train-vae", "sample-latent", "generate"}
    for name, command in commands.items():
        for action in command._actions:
            if action.dest == "help":
                continue
            assert action.required == ((name, action.dest) in {("generate", "model"), ("generate", "prompt")}), \
                (name, action.dest)
            assert action.help, (name, action.dest)


@pytest.mark.parametrize("sampler", ["ddim", "ddpm", "dpm", "euler"])
def test_a_sampler_swap_keeps_every_option_of_a_fresh_scheduler(sampler) -> None:
    # the training command swaps the sampler on a scheduler built in the process, the
    # sample command on one loaded from disk (every option explicit): both must agree
    fresh = DDIMScheduler.from_config(DDPMScheduler(beta_schedule="squaredcos_cap_v2", clip_sample=True).config)
    loaded = DDIMScheduler.from_config({k: v for k, v in fresh.config.items() if not k.startswith("_")})
    swapped = with_sampler(SimpleNamespace(scheduler=fresh), sampler).scheduler
    expected = with_sampler(SimpleNamespace(scheduler=loaded), sampler).scheduler
    assert swapped.config["timestep_spacing"] == "leading"
    assert {k: v for k, v in swapped.config.items() if not k.startswith("_")} == \
        {k: v for k, v in expected.config.items() if not k.startswith("_")}
