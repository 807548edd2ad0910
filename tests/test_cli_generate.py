"""``python -m diffusion generate`` end to end on tiny random Stable Diffusion folders (2 steps):
the PNGs and their recorded parameters, seeds, schedulers, image to image, LoRA, SDXL, and a
one-line refusal (exit status 2, nothing written) for every bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from diffusion.cli import main
from diffusion.cli.generate import SCHEDULERS

from sd_folders import sd_folder, xl_folder

pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

ATTENTION = "unet.down_blocks.1.attentions.0.transformer_blocks.0"


def write_lora(path: Path, layers: list[str], seed: int = 0) -> str:
    """A rank-2 LoRA in the diffusers/PEFT key format for 32-channel Linear layers of the tiny UNet."""
    rng = np.random.default_rng(seed)
    weights = {}
    for layer in layers:
        weights[f"{layer}.lora_A.weight"] = rng.standard_normal((2, 32)).astype(np.float32)
        weights[f"{layer}.lora_B.weight"] = rng.standard_normal((32, 2)).astype(np.float32)
    safetensors_numpy.save_file(weights, str(path))
    return str(path)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """A tiny SD folder, broken copies of it, an input image, LoRA files and a stand-in SDXL index."""
    root = tmp_path_factory.mktemp("inputs")
    model = sd_folder(root / "model")
    no_vae = shutil.copytree(model, root / "no_vae")
    shutil.rmtree(no_vae / "vae")
    pickled = shutil.copytree(model, root / "pickled")
    weights = pickled / "unet" / "diffusion_pytorch_model.safetensors"
    weights.rename(weights.with_suffix(".bin"))
    (root / "empty").mkdir()
    (root / "xl_index").mkdir()
    (root / "xl_index" / "model_index.json").write_text('{"_class_name": "StableDiffusionXLPipeline"}')
    pixels = np.random.default_rng(0).integers(0, 256, (16, 24, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(root / "in.png")
    (root / "not_an_image.png").write_text("text")
    attention = [f"{ATTENTION}.{attn}.{proj}" for attn in ("attn1", "attn2") for proj in ("to_q", "to_out.0")]
    return {"root": str(root), "model": str(model), "no_vae": str(no_vae), "pickled": str(pickled),
            "empty": str(root / "empty"), "xl_index": str(root / "xl_index"), "image": str(root / "in.png"),
            "not_an_image": str(root / "not_an_image.png"), "lora": write_lora(root / "style.safetensors", attention),
            "misfit_lora": write_lora(root / "misfit.safetensors", [f"{ATTENTION}.attn1.no_such_layer"])}


def generate(model: str, *options: str) -> int:
    return main(["generate", "--model", model, "--prompt", "a photo of a cat", "--steps", "2", "--no-progress",
                 *options])


def pixels(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image)


def recorded(path: Path) -> dict:
    """The parameters in a PNG's text chunk, checked to match the JSON file beside it."""
    with Image.open(path) as image:
        chunk = json.loads(image.text["parameters"])
    assert json.loads(path.with_suffix(".json").read_text()) == chunk
    return chunk


@pytest.fixture(scope="module")
def plain(inputs, tmp_path_factory) -> np.ndarray:
    """The image of the default options (the folder's DDIM scheduler, seed 0, no LoRA)."""
    out = tmp_path_factory.mktemp("plain")
    assert generate(inputs["model"], "--out", str(out)) == 0
    return pixels(out / "image-0.png")


def test_generate_writes_pngs_with_their_parameters(inputs, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    status = generate(inputs["model"], "--num-images", "2", "--seed", "7", "--size", "24x16",
                      "--negative-prompt", "blurry", "--guidance-scale", "6")
    assert status == 0
    printed = [Path(line) for line in capsys.readouterr().out.splitlines() if line.endswith(".png")]
    assert len(printed) == 2 and all(path.is_file() for path in printed)
    assert printed[0].parent.parent == Path("runs") and printed[0].parent.name.startswith("generate-")
    for index, path in enumerate(printed):
        assert path.name == f"image-{index}.png"
        with Image.open(path) as image:
            assert image.size == (24, 16) and image.mode == "RGB"
        assert recorded(path) == {
            "prompt": "a photo of a cat", "negative_prompt": "blurry", "steps": 2, "guidance_scale": 6.0, "seed": 7,
            "size": "24x16", "scheduler": "DDIMScheduler", "loras": [], "model": inputs["model"], "image": None,
            "strength": None, "dtype": "float32", "num_images": 2, "index": index}
    assert not np.array_equal(pixels(printed[0]), pixels(printed[1]))  # one generator, two draws


def test_the_same_seed_gives_the_same_images(inputs, plain, tmp_path) -> None:
    assert generate(inputs["model"], "--seed", "0", "--out", str(tmp_path / "again")) == 0
    assert generate(inputs["model"], "--seed", "1", "--out", str(tmp_path / "other")) == 0
    assert np.array_equal(pixels(tmp_path / "again" / "image-0.png"), plain)
    assert not np.array_equal(pixels(tmp_path / "other" / "image-0.png"), plain)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_scheduler_swap(name, inputs, plain, tmp_path) -> None:
    assert generate(inputs["model"], "--scheduler", name, "--out", str(tmp_path)) == 0
    assert recorded(tmp_path / "image-0.png")["scheduler"] == name
    # the folder's scheduler is DDIM: "ddim" keeps its images, any other sampler changes them
    assert np.array_equal(pixels(tmp_path / "image-0.png"), plain) == (name == "ddim")


def test_image_to_image(inputs, tmp_path) -> None:
    assert generate(inputs["model"], "--image", inputs["image"], "--strength", "0.5", "--steps", "4",
                    "--out", str(tmp_path / "half")) == 0
    with Image.open(tmp_path / "half" / "image-0.png") as image:
        assert image.size == (24, 16)  # the input's
    parameters = recorded(tmp_path / "half" / "image-0.png")
    assert parameters["image"] == inputs["image"] and parameters["strength"] == 0.5
    assert generate(inputs["model"], "--image", inputs["image"], "--size", "16x16",
                    "--out", str(tmp_path / "resized")) == 0
    parameters = recorded(tmp_path / "resized" / "image-0.png")
    assert parameters["size"] == "16x16" and parameters["strength"] == 0.8  # the pipeline's default


def test_a_lora_changes_the_image_by_its_scale(inputs, plain, tmp_path) -> None:
    assert generate(inputs["model"], "--lora", inputs["lora"], "--out", str(tmp_path / "full")) == 0
    assert generate(inputs["model"], "--lora", f"{inputs['lora']}:0", "--out", str(tmp_path / "off")) == 0
    assert not np.array_equal(pixels(tmp_path / "full" / "image-0.png"), plain)
    assert np.array_equal(pixels(tmp_path / "off" / "image-0.png"), plain)
    assert recorded(tmp_path / "off" / "image-0.png")["loras"] == [{"file": inputs["lora"], "scale": 0.0}]


def test_an_sdxl_folder(tmp_path) -> None:
    model = xl_folder(tmp_path / "xl")
    assert generate(str(model), "--out", str(tmp_path / "out")) == 0
    parameters = recorded(tmp_path / "out" / "image-0.png")
    assert parameters["guidance_scale"] == 5.0 and parameters["scheduler"] == "EulerDiscreteScheduler"
    assert parameters["size"] == "16x16"


BAD = {
    "missing folder": ["--model", "{root}/missing"],
    "no model_index.json": ["--model", "{empty}"],
    "missing part": ["--model", "{no_vae}"],
    "pickled weights": ["--model", "{pickled}"],
    "unknown scheduler": ["--scheduler", "heun"],
    "size not a multiple of 8": ["--size", "500x512"],
    "size not WxH": ["--size", "512"],
    "strength without image": ["--strength", "0.5"],
    "strength above 1": ["--image", "{image}", "--strength", "1.5"],
    "strength 0": ["--image", "{image}", "--strength", "0"],
    "strength leaving no step": ["--image", "{image}", "--strength", "0.4"],
    "missing image": ["--image", "{root}/missing.png"],
    "not an image": ["--image", "{not_an_image}"],
    "sdxl and image": ["--model", "{xl_index}", "--image", "{image}"],
    "missing lora": ["--lora", "{root}/missing.safetensors"],
    "lora not safetensors": ["--lora", "{root}/style.bin"],
    "bad lora scale": ["--lora", "{lora}:strong"],
    "lora that fits no layer": ["--lora", "{misfit_lora}"],
    "unknown dtype": ["--dtype", "float64"],
    "no prompt": ["--prompt"],
}


@pytest.mark.parametrize("options", BAD.values(), ids=BAD.keys())
def test_a_bad_input_is_one_line_and_writes_nothing(options, inputs, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        status = generate(inputs["model"], *[option.format(**inputs) for option in options])
    except SystemExit as exit_:  # argparse's own checks
        status = exit_.code
    assert status == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m diffusion generate: error: "), captured.err
    assert captured.out == "" and list(tmp_path.iterdir()) == []


def test_earlier_images_are_never_overwritten(inputs, tmp_path, capsys) -> None:
    (tmp_path / "image-0.png").write_bytes(b"earlier")
    assert generate(inputs["model"], "--out", str(tmp_path)) == 2
    assert "already holds image-0.png" in capsys.readouterr().err
    assert (tmp_path / "image-0.png").read_bytes() == b"earlier" and not (tmp_path / "image-0.json").exists()
