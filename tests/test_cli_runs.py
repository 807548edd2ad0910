"""``python -m diffusion`` refusing before any work: runs that would mix, ``--resume`` with the
run's own options, checkpoints that do not cover the model, output paths of the wrong kind,
absurd sizes and a VAE that cannot scale -- each exit status 2, one line, nothing created.
The commands run in this process (``main``) on one tiny training run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from diffusion import AutoencoderKL, DDPMScheduler, DiffusionPipeline, UNet2D
from diffusion.cli import main
from diffusion.cli.digits import unet_config, vae_config
from diffusion.training import load_checkpoint

TINY = ["--batch-size", "8", "--channels", "8,16", "--warmup-steps", "1", "--log-every", "2", "--checkpoint-every", "2",
        "--per-class", "1", "--sample-steps", "2", "--no-progress"]
TINY_SAMPLE = ["--per-class", "1", "--sample-steps", "2", "--no-progress"]
SHORT = ["--steps", "2", *TINY]  # a refusal missed costs seconds, not a default-length run


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def refused(args: list[str], capsys: pytest.CaptureFixture) -> str:
    """Run ``args``; check the refusal (status 2, one line on stderr, nothing on stdout) and return its line."""
    assert main(args) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == "", captured
    return lines[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 4-step ``train`` run (checkpoints at steps 2 and 4)."""
    folder = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", "--steps", "4", *TINY, "--out", str(folder)]) == 0
    return folder


def test_train_onto_another_run_is_refused(run, capsys):
    before = files(run)
    line = refused(["train", *SHORT, "--out", str(run)], capsys)
    assert f"--resume {run}" in line and "another folder" in line
    assert files(run) == before


def test_resume_refuses_options_that_contradict_the_run(run, capsys):
    before = files(run)
    line = refused(["train", "--resume", str(run), "--steps", "1500", "--lr", "0.1", "--checkpoint-every", "2"],
                   capsys)
    assert "--steps 4 (given: 1500)" in line and "--lr 0.002 (given: 0.1)" in line
    assert "--checkpoint-every" not in line  # repeated with the run's value
    assert files(run) == before


def test_resume_continues_with_the_run_s_options(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    finished = load_checkpoint(copy / "checkpoints" / "step-0000004.safetensors")
    assert main(["train", "--resume", str(copy / "checkpoints" / "step-0000002.safetensors"), "--no-progress",
                 "--sample-steps", "3"]) == 0
    assert "trained 4 steps" in capsys.readouterr().out  # not the default 1500
    resumed = load_checkpoint(copy / "checkpoints" / "step-0000004.safetensors")
    assert resumed.step == 4
    assert resumed.config["cli"] == {**finished.config["cli"], "sample_steps": 3}  # the grid's steps may change
    assert resumed.lr_scheduler == finished.lr_scheduler
    assert resumed.optimizer["param_groups"] == finished.optimizer["param_groups"]


def _without(source: Path, target: Path, drop) -> Path:
    """A copy of the checkpoint ``source`` lacking the arrays ``drop(names)`` names."""
    with safe_open(str(source), framework="numpy") as f:
        metadata, names = f.metadata(), list(f.keys())
        dropped = set(drop(names))
        save_file({n: f.get_tensor(n) for n in names if n not in dropped}, str(target), metadata=metadata)
    return target


def _ema_names(names: list[str]) -> list[str]:
    return sorted((n for n in names if n.startswith("ema.")), key=lambda n: int(n.split(".")[1]))


@pytest.mark.parametrize("drop, expected", [
    (lambda names: _ema_names(names)[-20:], "20 weights missing"),
    (lambda names: ["ema.3"], "ema.3"),
    (lambda names: [n for n in names if n.startswith("model.")][:2], "2 weights missing"),
], ids=["last-20-averages", "one-average", "model-weights"])
def test_sample_refuses_a_checkpoint_that_does_not_cover_the_model(run, tmp_path, monkeypatch, capsys, drop,
                                                                   expected):
    monkeypatch.chdir(tmp_path)
    broken = _without(run / "checkpoints" / "step-0000004.safetensors", tmp_path / "broken.safetensors", drop)
    line = refused(["sample", "--checkpoint", str(broken), "--out", "grid", *TINY_SAMPLE], capsys)
    assert expected in line and "broken.safetensors" in line
    assert files(tmp_path) == ["broken.safetensors"]


def _file(root: Path, name: str) -> None:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text("x")


PATH_CASES = {
    "out-is-a-file": (lambda root: _file(root, "out"), ["train", *SHORT, "--out", "out"], "is a file"),
    "out-under-a-file": (lambda root: _file(root, "out"), ["train", *SHORT, "--out", "out/run"], "lies under the file"),
    "sample-out-is-a-file": (lambda root: _file(root, "out"), ["sample", *TINY_SAMPLE, "--out", "out"], "is a file"),
    "samples.png-is-a-folder": (lambda root: (root / "out" / "samples.png").mkdir(parents=True),
                                ["sample", *TINY_SAMPLE, "--out", "out"], "samples.png' exists and is not a file"),
    "pipeline-is-a-file": (lambda root: _file(root, "out/pipeline"), ["train", *SHORT, "--out", "out"],
                           "pipeline' exists and is not a folder"),
    "absurd-batch-size": (lambda root: None, ["train", *SHORT, "--batch-size", "100000000"],
                          "--batch-size: 100000000"),
    "resume-missing": (lambda root: None, ["train", *SHORT, "--resume", "missing"], "does not exist"),
}


@pytest.mark.parametrize("case", list(PATH_CASES))
def test_paths_and_sizes_are_checked_before_anything_is_created(run, case, tmp_path, monkeypatch, capsys):
    prepare, args, expected = PATH_CASES[case]
    monkeypatch.chdir(tmp_path)
    prepare(tmp_path)
    before = files(tmp_path)
    if args[0] == "sample":
        args = [*args, "--checkpoint", str(run)]
    assert expected in refused(args, capsys)
    assert files(tmp_path) == before


def test_train_refuses_a_vae_with_a_zero_scaling_factor(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    AutoencoderKL(**vae_config(8, (8,), 2)).save_pretrained(tmp_path / "vae")
    config = tmp_path / "vae" / "config.json"
    config.write_text(config.read_text().replace('"scaling_factor": 0.18215', '"scaling_factor": 0'))
    before = files(tmp_path)
    assert "scaling_factor" in refused(["train", *SHORT, "--vae", "vae", "--out", "latent"], capsys)
    assert files(tmp_path) == before


def test_sample_swaps_the_scheduler_of_a_saved_ddpm_pipeline(tmp_path, capsys):
    unet = UNet2D(**unet_config(8, (8, 16), 1))
    DiffusionPipeline(unet.eval(), DDPMScheduler(clip_sample=True), null_class_label=10).save_pretrained(
        tmp_path / "pipeline")
    for sampler in ("dpm", "euler", "ddim"):
        assert main(["sample", "--checkpoint", str(tmp_path / "pipeline"), "--sampler", sampler,
                     "--out", str(tmp_path / sampler), *TINY_SAMPLE]) == 0, capsys.readouterr().err
        assert (tmp_path / sampler / "samples.png").is_file()
