"""diffusers folders: save_pretrained / from_pretrained round trips, half-precision
checkpoints, early diffusers key names, bad folders and checkpoints (clear errors, model
untouched), configs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file as write_safetensors

import tensorcore as tc
from diffusion import AutoencoderKL, UNet2D
from diffusion.models import pretrained
from diffusion.models.pretrained import CONFIG_NAME, WEIGHTS_NAME
from layers.serialization import load_file
from models_oracle import SMALL_UNET, SMALL_VAE, randn

MODELS = {"unet": (UNet2D, SMALL_UNET), "vae": (AutoencoderKL, SMALL_VAE)}


def snapshot(model) -> dict[str, np.ndarray]:
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", list(MODELS))
def test_round_trip_is_exact(kind, tmp_path) -> None:
    cls, config = MODELS[kind]
    model = cls(**config)
    model.save_pretrained(tmp_path / "model")
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [CONFIG_NAME, WEIGHTS_NAME]
    loaded = cls.from_pretrained(tmp_path / "model")
    assert not loaded.training
    assert dict(loaded.config) == dict(model.config)
    before, after = snapshot(model), snapshot(loaded)
    assert before.keys() == after.keys()
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])
    saved = json.loads((tmp_path / "model" / CONFIG_NAME).read_text())
    assert saved["_class_name"] == cls.diffusers_class
    assert saved["block_out_channels"] == list(config["block_out_channels"])


@pytest.mark.parametrize("kind", list(MODELS))
def test_diffusers_loads_what_we_save(kind, tmp_path) -> None:
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    cls, config = MODELS[kind]
    ours = cls(**config).eval()
    ours.save_pretrained(tmp_path)
    theirs = getattr(diffusers, cls.diffusers_class).from_pretrained(tmp_path).eval()
    for key, value in theirs.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), ours.state_dict()[key].numpy())
    x = randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = (theirs(torch.tensor(x), torch.tensor([3, 30]), class_labels=torch.tensor([0, 4])) if kind == "unet"
                    else theirs(torch.tensor(x))).sample.numpy()
    with tc.no_grad():
        actual = (ours(tc.tensor(x), tc.tensor([3, 30]), tc.tensor([0, 4])) if kind == "unet" else ours(tc.tensor(x))).numpy()
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_checkpoints_load_into_float32_or_stay_half(half, tmp_path) -> None:
    model = UNet2D(**SMALL_UNET)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / WEIGHTS_NAME)
    halved = {k: v.astype(getattr(tc, half)) for k, v in weights.items()}
    write_safetensors(halved, str(tmp_path / WEIGHTS_NAME))
    loaded = UNet2D.from_pretrained(tmp_path)
    for key, value in loaded.state_dict().items():
        assert value.dtype == tc.float32
        np.testing.assert_array_equal(value.numpy(), halved[key].astype(np.float32))
    kept = UNet2D.from_pretrained(tmp_path, dtype=getattr(tc, half))
    assert {v.dtype for v in kept.state_dict().values()} == {getattr(tc, half)}


def test_early_diffusers_attention_names_are_renamed(tmp_path) -> None:
    model = AutoencoderKL(**SMALL_VAE)
    model.save_pretrained(tmp_path)
    new_to_old = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}
    weights = load_file(tmp_path / WEIGHTS_NAME)
    renamed = {}
    for key, value in weights.items():
        for new, old in new_to_old.items():
            key = key.replace(f".attentions.0.{new}.", f".attentions.0.{old}.")
        renamed[key] = value
    assert "encoder.mid_block.attentions.0.proj_attn.weight" in renamed
    write_safetensors(renamed, str(tmp_path / WEIGHTS_NAME))
    loaded = AutoencoderKL.from_pretrained(tmp_path)
    for key, value in snapshot(model).items():
        np.testing.assert_array_equal(loaded.state_dict()[key].numpy(), value)


def test_sharded_checkpoints_load(tmp_path) -> None:
    model = UNet2D(**SMALL_UNET)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / WEIGHTS_NAME)
    (tmp_path / WEIGHTS_NAME).unlink()
    keys = sorted(weights)
    shards = {"part-1.safetensors": keys[: len(keys) // 2], "part-2.safetensors": keys[len(keys) // 2:]}
    for name, part in shards.items():
        write_safetensors({k: weights[k] for k in part}, str(tmp_path / name))
    index = {"weight_map": {k: name for name, part in shards.items() for k in part}}
    (tmp_path / pretrained.WEIGHTS_INDEX_NAME).write_text(json.dumps(index))
    loaded = UNet2D.from_pretrained(tmp_path)
    for key, value in weights.items():
        np.testing.assert_array_equal(loaded.state_dict()[key].numpy(), value)


def test_unknown_config_keys_warn_and_private_keys_do_not(tmp_path) -> None:
    UNet2D(**SMALL_UNET).save_pretrained(tmp_path)
    config = json.loads((tmp_path / CONFIG_NAME).read_text())
    config.update(_diffusers_version="0.42.0", _name_or_path="x", magic_knob=3)
    (tmp_path / CONFIG_NAME).write_text(json.dumps(config))
    with pytest.warns(UserWarning, match=r"ignoring unknown config keys \['magic_knob'\]"):
        UNet2D.from_pretrained(tmp_path)


def test_missing_block_types_mean_what_diffusers_means(tmp_path) -> None:
    config = {"block_out_channels": [8, 8, 8, 8], "norm_num_groups": 4, "attention_head_dim": 4}
    (tmp_path / CONFIG_NAME).write_text(json.dumps(config))
    write_safetensors({}, str(tmp_path / WEIGHTS_NAME))
    with pytest.raises(ValueError, match="missing keys: .*down_blocks.1.attentions.0.to_q.weight"):
        UNet2D.from_pretrained(tmp_path)  # diffusers' default block types carry attention on levels 1-3


def test_bad_checkpoints_raise_naming_the_key_and_leave_the_model_untouched(tmp_path) -> None:
    model = UNet2D(**SMALL_UNET)
    model.save_pretrained(tmp_path)
    before = snapshot(model)
    weights = load_file(tmp_path / WEIGHTS_NAME)

    missing = dict(weights)
    missing.pop("conv_out.bias")
    with pytest.raises(ValueError, match=r"missing keys: conv_out\.bias"):
        model.load_state_dict({**missing, "conv_in.weight": np.zeros_like(weights["conv_in.weight"])})
    misshaped = {**weights, "time_embedding.linear_1.weight": np.zeros((3, 3), np.float32),
                 "conv_in.bias": np.zeros_like(weights["conv_in.bias"])}
    with pytest.raises(ValueError, match=r"wrong shapes: time_embedding\.linear_1\.weight \(expected"):
        model.load_state_dict(misshaped)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes((tmp_path / WEIGHTS_NAME).read_bytes()[:-100])
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        model.load(truncated)
    for key, value in snapshot(model).items():
        np.testing.assert_array_equal(value, before[key])

    write_safetensors(misshaped, str(tmp_path / WEIGHTS_NAME))
    with pytest.raises(ValueError, match=r"time_embedding\.linear_1\.weight"):
        UNet2D.from_pretrained(tmp_path)
    (tmp_path / WEIGHTS_NAME).write_bytes(truncated.read_bytes())
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        UNet2D.from_pretrained(tmp_path)


def test_bad_folders_raise(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no config.json"):
        UNet2D.from_pretrained(tmp_path)
    AutoencoderKL(**SMALL_VAE).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="describes a AutoencoderKL, not a UNet2DModel"):
        UNet2D.from_pretrained(tmp_path)
    (tmp_path / WEIGHTS_NAME).unlink()
    (tmp_path / "diffusion_pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ValueError, match="never loaded; convert them to safetensors"):
        AutoencoderKL.from_pretrained(tmp_path)
    (tmp_path / CONFIG_NAME).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        AutoencoderKL.from_pretrained(tmp_path)


def test_a_failed_save_leaves_the_previous_files(tmp_path, monkeypatch) -> None:
    first = UNet2D(**SMALL_UNET)
    first.save_pretrained(tmp_path)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def broken(path, payload):
        raise OSError("disk full")

    monkeypatch.setattr(pretrained, "write_atomic", broken)
    monkeypatch.setattr("layers.serialization.write_atomic", broken)
    with pytest.raises(OSError, match="disk full"):
        UNet2D(**SMALL_UNET).save_pretrained(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


def test_configs_are_frozen_data() -> None:
    model = UNet2D(**SMALL_UNET)
    assert model.config.block_out_channels == (16, 32) and model.config["layers_per_block"] == 1
    with pytest.raises(AttributeError, match="frozen"):
        model.config.layers_per_block = 3
    twin = UNet2D.from_config(model.config)
    assert dict(twin.config) == dict(model.config)
    assert {k: v.shape for k, v in twin.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    assert UNet2D.from_config(model.config, out_channels=5).conv_out.weight.shape[0] == 5
