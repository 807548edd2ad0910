"""Model folders from strangers: bounded configs, checked headers, regular files only, paths kept inside."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from safetensors.numpy import save_file as write_safetensors

from diffusion import AutoencoderKL, DiffusionPipeline, UNet2D
from diffusion.models import unet_2d, weights
from diffusion.models.pretrained import CONFIG_NAME, WEIGHTS_NAME
from diffusion.pipelines.pretrained import INDEX_NAME
from layers.serialization import load_file
from models_oracle import SMALL_UNET

TINY = dict(SMALL_UNET, block_out_channels=[8, 8], num_class_embeds=None)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_unet")
    UNet2D(**TINY).save_pretrained(folder)
    return folder


def unet_folder(tmp_path, config):
    (tmp_path / CONFIG_NAME).write_text(json.dumps(config))
    write_safetensors({}, str(tmp_path / WEIGHTS_NAME))
    return tmp_path


@pytest.mark.parametrize("key, value, expected", [
    ("layers_per_block", 200000, "'layers_per_block' must be an int from 1 to 256, got 200000"),
    ("layers_per_block", 0, "'layers_per_block' must be an int from 1"),
    ("layers_per_block", 2.0, "'layers_per_block' must be an int"),
    ("block_out_channels", [1e8, 16], r"'block_out_channels' must be a list of 1 to 256 items, each an int"),
    ("block_out_channels", 64, r"'block_out_channels' must be a list"),
    ("block_out_channels", [2 ** 18, 16], r"at least [\d,]+ parameters .* most come from block_out_channels="),
    ("num_class_embeds", 1e12, "'num_class_embeds' must be null or an int"),
    ("num_class_embeds", 2 ** 24, "most come from num_class_embeds=16777216"),  # with time_embedding_dim 2**20
    ("in_channels", -3, "'in_channels' must be an int from 1"),
    ("down_block_types", "DownBlock2D", "'down_block_types' must be a list"),
])
def test_absurd_unet_configs_build_nothing(tmp_path, monkeypatch, key, value, expected):
    monkeypatch.setattr(unet_2d, "Conv2d", None)  # building anything would fail with a TypeError instead
    folder = unet_folder(tmp_path, {**TINY, "time_embedding_dim": 2 ** 20, key: value})
    with pytest.raises(ValueError, match=f"^UNet2D: .*{expected}"):
        UNet2D.from_pretrained(folder)


def test_absurd_vae_configs_raise_naming_the_key():
    with pytest.raises(ValueError, match="^AutoencoderKL: config key 'layers_per_block' .* got 200000"):
        AutoencoderKL.from_config({"layers_per_block": 200000})
    with pytest.raises(ValueError, match="^AutoencoderKL: config key 'block_out_channels' .* got \\[64.0\\]"):
        AutoencoderKL.from_config({"block_out_channels": [64.0]})


def test_deep_or_huge_config_files_raise_value_errors(tmp_path):
    (tmp_path / CONFIG_NAME).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nests deeper than"):
        UNet2D.from_pretrained(tmp_path)
    (tmp_path / CONFIG_NAME).write_text('{"a": ' * 100 + "1" + "}" * 100)
    with pytest.raises(ValueError, match="nests deeper than 64 levels"):
        UNet2D.from_pretrained(tmp_path)
    (tmp_path / CONFIG_NAME).write_text(json.dumps({"pad": " " * (17 << 20)}))
    with pytest.raises(ValueError, match="larger than the"):
        UNet2D.from_pretrained(tmp_path)


def test_headers_are_checked_against_the_model_before_any_data_is_read(tiny_folder, tmp_path, monkeypatch):
    arrays = load_file(tiny_folder / WEIGHTS_NAME)
    (tmp_path / CONFIG_NAME).write_bytes((tiny_folder / CONFIG_NAME).read_bytes())
    monkeypatch.setattr(weights, "read_tensor", None)  # reading any tensor would fail with a TypeError
    misshaped = {**arrays, "conv_in.weight": np.zeros((8, 3, 5, 5), np.float32)}
    write_safetensors(misshaped, str(tmp_path / WEIGHTS_NAME))
    with pytest.raises(ValueError, match=r"wrong shapes: conv_in\.weight \(expected \(8, 3, 3, 3\), got \(8, 3, 5, 5\)"):
        UNet2D.from_pretrained(tmp_path)
    missing = {k: v for k, v in arrays.items() if k != "conv_out.bias"}
    write_safetensors(missing, str(tmp_path / WEIGHTS_NAME))
    with pytest.raises(ValueError, match=r"missing keys: conv_out\.bias"):
        UNet2D.from_pretrained(tmp_path)
    write_safetensors({**arrays, "conv_out.bias": np.zeros(3, np.int32)}, str(tmp_path / WEIGHTS_NAME))
    with pytest.raises(ValueError, match=r"not floating point: conv_out\.bias \(I32\)"):
        UNet2D.from_pretrained(tmp_path)


def test_header_lengths_must_match_the_file(tiny_folder, tmp_path):
    (tmp_path / CONFIG_NAME).write_bytes((tiny_folder / CONFIG_NAME).read_bytes())
    payload = (tiny_folder / WEIGHTS_NAME).read_bytes()
    (tmp_path / WEIGHTS_NAME).write_bytes(payload + b"\0" * 64)
    with pytest.raises(ValueError, match="declares [\\d,]+ bytes of data, the file holds"):
        UNet2D.from_pretrained(tmp_path)
    (tmp_path / WEIGHTS_NAME).write_bytes((2 ** 62).to_bytes(8, "little") + payload[8:])
    with pytest.raises(ValueError, match="header length 4611686018427387904"):
        UNet2D.from_pretrained(tmp_path)


DEV_ZERO = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from diffusion import UNet2D
from layers.serialization import load_file
for call in (lambda: UNet2D.from_pretrained(sys.argv[1]),
             lambda: load_file(sys.argv[1] + "/diffusion_pytorch_model.safetensors")):
    try:
        call()
    except ValueError as exc:
        print(exc)
"""


def _unblock_later(path):
    """Open ``path`` (a FIFO) for writing once a reader holds it, so a blocking reader would get EOF, not hang."""
    def run():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                return
            except OSError:
                time.sleep(0.2)
    threading.Thread(target=run, daemon=True).start()


def test_only_regular_files_are_read(tiny_folder, tmp_path):
    (tmp_path / CONFIG_NAME).write_bytes((tiny_folder / CONFIG_NAME).read_bytes())
    weights_path = tmp_path / WEIGHTS_NAME
    weights_path.symlink_to("/dev/zero")
    # a regression would read /dev/zero until memory runs out, so this runs in a child under a
    # 2 GiB address-space limit; load_file has no folder to stay in and must refuse the device itself
    child = subprocess.run([sys.executable, "-c", DEV_ZERO, str(tmp_path)], capture_output=True, text=True,
                           timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    folder_error, file_error = child.stdout.splitlines()
    assert "diffusion_pytorch_model.safetensors' leads outside" in folder_error
    assert "is not a regular file (it resolves to '/dev/zero', a character device)" in file_error
    weights_path.unlink()
    os.mkfifo(weights_path)
    _unblock_later(weights_path)
    with pytest.raises(ValueError, match="is not a regular file .* a FIFO"):
        UNet2D.from_pretrained(tmp_path)
    weights_path.unlink()
    weights_path.mkdir()
    with pytest.raises(ValueError, match="is not a regular file .* a directory"):
        UNet2D.from_pretrained(tmp_path)
    (tmp_path / CONFIG_NAME).unlink()
    os.mkfifo(tmp_path / CONFIG_NAME)
    _unblock_later(tmp_path / CONFIG_NAME)
    with pytest.raises(ValueError, match="is not a regular file .* a FIFO"):
        UNet2D.from_pretrained(tmp_path)


@pytest.mark.parametrize("shard", ["../../elsewhere.safetensors", "/etc/passwd", "link.safetensors"])
def test_shards_stay_inside_the_folder(tiny_folder, tmp_path, shard):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / CONFIG_NAME).write_bytes((tiny_folder / CONFIG_NAME).read_bytes())
    (tmp_path / "outside.safetensors").write_bytes((tiny_folder / WEIGHTS_NAME).read_bytes())
    (folder / "link.safetensors").symlink_to(tmp_path / "outside.safetensors")
    index = {"weight_map": {"conv_in.weight": shard}}
    (folder / f"{WEIGHTS_NAME}.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=rf"weight_map\['conv_in.weight'\]: '{shard}' .*(outside|relative path)"):
        UNet2D.from_pretrained(folder)


@pytest.mark.parametrize("entry, expected", [
    (["diffusers", "/etc/passwd"], r"entry 'unet' names class '/etc/passwd'; expected \['UNet2D', 'UNet2DModel'\]"),
    (["pickle", "UNet2DModel"], r"entry 'unet' names library 'pickle'; expected one of"),
    ("UNet2DModel", r"entry 'unet' must be \[library, ClassName\] \(two strings\), got 'UNet2DModel'"),
])
def test_model_index_entries_are_checked(tmp_path, entry, expected):
    for part in ("unet", "scheduler"):
        (tmp_path / part).mkdir()
    (tmp_path / INDEX_NAME).write_text(json.dumps({"unet": entry, "scheduler": ["diffusers", "DDIMScheduler"]}))
    with pytest.raises(ValueError, match=expected):
        DiffusionPipeline.from_pretrained(tmp_path)


@pytest.mark.parametrize("scheduler, expected", [
    (5, r"entry 'scheduler' must be \[library, ClassName\] \(two strings\), got 5"),
    ("DDIMScheduler", r"entry 'scheduler' must be \[library, ClassName\] \(two strings\), got 'DDIMScheduler'"),
    (["diffusers", "PickleScheduler"], r"entry 'scheduler' names class 'PickleScheduler'; expected \['DDIM"),
])
def test_model_index_scheduler_entries_are_checked(tmp_path, scheduler, expected):
    for part in ("unet", "scheduler"):
        (tmp_path / part).mkdir()
    (tmp_path / INDEX_NAME).write_text(json.dumps({"unet": ["diffusers", "UNet2DModel"], "scheduler": scheduler}))
    with pytest.raises(ValueError, match=expected):
        DiffusionPipeline.from_pretrained(tmp_path)


def test_model_index_parts_stay_inside_the_folder(tmp_path):
    root, outside = tmp_path / "pipe", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "scheduler").mkdir()
    (root / INDEX_NAME).write_text(json.dumps({"unet": ["diffusers", "UNet2DModel"],
                                               "scheduler": ["diffusers", "DDIMScheduler"]}))
    with pytest.raises(ValueError, match=r"entry 'unet': the folder 'unet' does not exist"):
        DiffusionPipeline.from_pretrained(root)
    (root / "unet").symlink_to(outside)
    with pytest.raises(ValueError, match=r"entry 'unet': 'unet' leads outside"):
        DiffusionPipeline.from_pretrained(root)
    (root / INDEX_NAME).write_text(json.dumps({"../outside": ["diffusers", "UNet2DModel"]}))
    with pytest.raises(ValueError, match=r"entry '../outside'"):
        DiffusionPipeline.from_pretrained(root)
