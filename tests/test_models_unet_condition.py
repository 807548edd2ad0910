"""UNet2DConditionModel against diffusers' own on the same weights: tiny SD-1.x, SD-2.x, SDXL
and LCM configs, drawn configs, timestep forms, round trips through diffusers, variants and
shards, and the errors bad folders, configs and inputs raise."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tensorcore as tc
from diffusion import UNet2DConditionModel
from diffusion.models.bounds import check_config as check_bounds
from diffusion.models.pretrained import CONFIG_NAME, WEIGHTS_NAME
from diffusion.models.unet_2d_condition_config import check_config, levels
from models_oracle import perturbed, randn

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

TINY = dict(block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8, sample_size=8)
FAMILIES = {
    # conv projections, attention_head_dim read as the head count
    "sd1": dict(TINY, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16, attention_head_dim=2),
    # linear projections, per-level heads, upcast attention
    "sd2": dict(TINY, down_block_types=("CrossAttnDownBlock2D",) * 2, up_block_types=("CrossAttnUpBlock2D",) * 2,
                cross_attention_dim=24, attention_head_dim=(2, 4), use_linear_projection=True, upcast_attention=True),
    # text_time added conditions, per-level transformer depth, no attention at the first level
    "sdxl": dict(TINY, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                 up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32, attention_head_dim=(2, 4),
                 transformer_layers_per_block=(1, 2), use_linear_projection=True, addition_embed_type="text_time",
                 addition_time_embed_dim=8, projection_class_embeddings_input_dim=16 + 6 * 8),
    # a guidance embedding through time_cond_proj_dim
    "lcm": dict(TINY, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16, attention_head_dim=2,
                time_cond_proj_dim=8),
}
TOLERANCE = 2e-4  # max abs error in float32


def twins(config: dict, folder: Path, seed: int = 0, **save) -> tuple:
    """(diffusers model with perturbed weights, ours loaded from the folder diffusers saved)."""
    torch.manual_seed(seed)
    theirs = perturbed(diffusers.UNet2DConditionModel(**config), seed)
    theirs.save_pretrained(folder, **save)
    return theirs, UNet2DConditionModel.from_pretrained(folder, variant=save.get("variant"))


def inputs(config: dict, batch: int = 2, seed: int = 1) -> dict[str, np.ndarray]:
    """A sample, timesteps, text states and whatever added conditions the config asks for."""
    size = config.get("sample_size") or 8
    cross = config["cross_attention_dim"]
    values = {"sample": randn(batch, config.get("in_channels", 4), size, size, seed=seed),
              "timestep": np.array([7, 901][:batch], dtype=np.int64),
              "encoder_hidden_states": randn(batch, 5, cross if isinstance(cross, int) else cross[0], seed=seed + 1)}
    if config.get("addition_embed_type") == "text_time":
        time_ids = config["projection_class_embeddings_input_dim"] // config["addition_time_embed_dim"] - 2
        values["text_embeds"] = randn(batch, config["projection_class_embeddings_input_dim"]
                                      - time_ids * config["addition_time_embed_dim"], seed=seed + 2)
        values["time_ids"] = np.round(np.abs(randn(batch, time_ids, seed=seed + 3)) * 512).astype(np.float32)
    if config.get("time_cond_proj_dim"):
        values["timestep_cond"] = randn(batch, config["time_cond_proj_dim"], seed=seed + 4)
    if config.get("class_embed_type") in ("projection", "simple_projection"):
        values["class_labels"] = randn(batch, config["projection_class_embeddings_input_dim"], seed=seed + 5)
    elif config.get("class_embed_type") == "identity":
        values["class_labels"] = randn(batch, time_embed_dim(config), seed=seed + 5)
    elif config.get("class_embed_type") == "timestep":
        values["class_labels"] = np.array([3, 40][:batch], dtype=np.int64)
    elif config.get("num_class_embeds"):
        values["class_labels"] = np.arange(batch, dtype=np.int64) % config["num_class_embeds"]
    return values


def time_embed_dim(config: dict) -> int:
    """The width of the timestep embedding diffusers gives the config."""
    factor = 2 if config.get("time_embedding_type") == "fourier" else 4
    return config.get("time_embedding_dim") or factor * config["block_out_channels"][0]


def call(model, values: dict[str, np.ndarray], make) -> np.ndarray:
    """``model`` on ``values`` converted by ``make`` (torch.tensor or tc.tensor), as a NumPy array."""
    kwargs = {k: make(values[k]) for k in ("class_labels", "timestep_cond") if k in values}
    if "text_embeds" in values:
        kwargs["added_cond_kwargs"] = {k: make(values[k]) for k in ("text_embeds", "time_ids")}
    args = (make(values["sample"]), make(values["timestep"]), make(values["encoder_hidden_states"]))
    if make is torch.tensor:
        with torch.no_grad():
            return model(*args, **kwargs).sample.numpy()
    with tc.no_grad():
        return model(*args, **kwargs).numpy()


def max_error(ours, theirs, values) -> float:
    return float(np.abs(call(ours, values, tc.tensor) - call(theirs, values, torch.tensor)).max())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_families_equal_diffusers(family, tmp_path) -> None:
    config = FAMILIES[family]
    theirs, ours = twins(config, tmp_path)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    assert max_error(ours, theirs, inputs(config)) <= TOLERANCE


def test_gradients_equal_diffusers(tmp_path) -> None:
    config = FAMILIES["sdxl"]
    theirs, ours = twins(config, tmp_path)
    values = inputs(config, batch=1)
    added = {k: values[k] for k in ("text_embeds", "time_ids")}
    out = ours(*(tc.tensor(values[k]) for k in ("sample", "timestep", "encoder_hidden_states")),
               added_cond_kwargs={k: tc.tensor(v) for k, v in added.items()})
    (out * out).sum().backward()
    expected = theirs(*(torch.tensor(values[k]) for k in ("sample", "timestep", "encoder_hidden_states")),
                      added_cond_kwargs={k: torch.tensor(v) for k, v in added.items()}).sample
    (expected * expected).sum().backward()
    reference = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        grad = reference[name].grad.numpy()
        assert np.abs(p.grad.numpy() - grad).max() <= 1e-3 * np.abs(grad).max(), name


def test_compiled_calls_equal_eager(tmp_path) -> None:
    config = FAMILIES["sdxl"]
    model = UNet2DConditionModel(**config).eval()
    values = inputs(config)
    args = tuple(tc.tensor(values[k]) for k in ("sample", "timestep", "encoder_hidden_states"))
    added = {"added_cond_kwargs": {k: tc.tensor(values[k]) for k in ("text_embeds", "time_ids")}}
    step = tc.compile(model)
    with tc.no_grad():
        eager = model(*args, **added).numpy()
        for _ in range(2):  # the trace, then the replay
            np.testing.assert_allclose(step(*args, **added).numpy(), eager, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["sd2", "sdxl"])
def test_float16_stays_within_its_bound_of_diffusers_float32(family, tmp_path) -> None:
    """Half weights and activations, the timestep sinusoids and upcast attention in float32."""
    config = FAMILIES[family]
    theirs, ours = twins(config, tmp_path)
    values = inputs(config)
    expected = call(theirs, values, torch.tensor)
    ours.to(tc.float16)
    actual = call(ours, values, lambda v: tc.tensor(v, dtype=tc.float16 if v.dtype.kind == "f" else None))
    assert actual.dtype == np.float16
    assert np.abs(actual.astype(np.float32) - expected).max() <= 2e-2 * np.abs(expected).max()


def test_timestep_forms_broadcast_as_diffusers(tmp_path) -> None:
    config = FAMILIES["sd1"]
    theirs, ours = twins(config, tmp_path)
    values = {**inputs(config), "timestep": np.array([37, 37])}
    expected = call(theirs, values, torch.tensor)
    sample, states = tc.tensor(values["sample"]), tc.tensor(values["encoder_hidden_states"])
    for timestep in (37, 37.0, tc.tensor(37), tc.tensor([37])):
        with tc.no_grad():
            actual = ours(sample, timestep, states).numpy()
        assert np.abs(actual - expected).max() <= TOLERANCE, timestep


def test_odd_sizes_upsample_to_the_skips_as_diffusers(tmp_path) -> None:
    config = {**FAMILIES["sd1"], "block_out_channels": (16, 16, 32), "norm_num_groups": 4,
              "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
              "up_block_types": ("UpBlock2D", "UpBlock2D", "CrossAttnUpBlock2D")}
    theirs, ours = twins(config, tmp_path)
    values = {**inputs(config), "sample": randn(2, 4, 7, 10, seed=6)}
    assert max_error(ours, theirs, values) <= TOLERANCE


def test_diffusers_loads_what_we_save(tmp_path) -> None:
    config = FAMILIES["sdxl"]
    _, ours = twins(config, tmp_path / "theirs", seed=3)
    ours.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / CONFIG_NAME).read_text())
    assert saved["_class_name"] == "UNet2DConditionModel"
    reloaded = diffusers.UNet2DConditionModel.from_pretrained(tmp_path / "ours").eval()
    assert max_error(ours, reloaded, inputs(config)) <= TOLERANCE


def test_half_variant_and_shards_load(tmp_path) -> None:
    config = FAMILIES["sd2"]
    theirs, ours = twins(config, tmp_path / "fp16", variant="fp16")
    assert (tmp_path / "fp16" / "diffusion_pytorch_model.fp16.safetensors").exists()
    assert ours.dtype == tc.float32
    assert max_error(ours, theirs, inputs(config)) <= TOLERANCE
    theirs, ours = twins(config, tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / (WEIGHTS_NAME + ".index.json")).exists()
    assert max_error(ours, theirs, inputs(config)) <= TOLERANCE


@st.composite
def configs(draw) -> dict:
    """Small configs across the keys: block types, heads, projections, depths, embeddings, kernels."""
    down = draw(st.lists(st.sampled_from(["CrossAttnDownBlock2D", "DownBlock2D"]), min_size=1, max_size=2))
    up = [{"CrossAttnDownBlock2D": "CrossAttnUpBlock2D", "DownBlock2D": "UpBlock2D"}[t] for t in down[::-1]]
    if draw(st.booleans()):
        up = [draw(st.sampled_from(["CrossAttnUpBlock2D", "UpBlock2D"])) for _ in up]
    levels = len(down)
    per_level = lambda values: draw(st.sampled_from(values)) if draw(st.booleans()) \
        else tuple(draw(st.sampled_from(values)) for _ in range(levels))
    config = dict(
        block_out_channels=(16, 32)[:levels], layers_per_block=per_level([1, 2]), norm_num_groups=4, sample_size=4,
        down_block_types=tuple(down), up_block_types=tuple(up), cross_attention_dim=draw(st.sampled_from([8, 12])),
        attention_head_dim=per_level([1, 2, 4]), transformer_layers_per_block=per_level([1, 2]),
        use_linear_projection=draw(st.booleans()), upcast_attention=draw(st.booleans()),
        only_cross_attention=per_level([False, True]), in_channels=draw(st.sampled_from([3, 4])),
        out_channels=draw(st.sampled_from([3, 4])), flip_sin_to_cos=draw(st.booleans()),
        freq_shift=draw(st.sampled_from([0, 1])), conv_in_kernel=draw(st.sampled_from([1, 3])),
        conv_out_kernel=draw(st.sampled_from([1, 3])),
        resnet_time_scale_shift=draw(st.sampled_from(["default", "scale_shift"])),
        mid_block_type=draw(st.sampled_from(["UNetMidBlock2DCrossAttn", "UNetMidBlock2D", None])),
        mid_block_scale_factor=draw(st.sampled_from([1.0, 0.5])),
        time_embedding_act_fn=draw(st.sampled_from([None, "silu"])),
        time_cond_proj_dim=draw(st.sampled_from([None, 5])), act_fn=draw(st.sampled_from(["silu", "gelu"])),
        time_embedding_type=draw(st.sampled_from(["positional", "fourier"])),
        time_embedding_dim=draw(st.sampled_from([None, 24])), timestep_post_act=draw(st.sampled_from([None, "silu"])))
    if not any(t.startswith("CrossAttn") for t in down + up) and config["mid_block_type"] != "UNetMidBlock2DCrossAttn":
        config["mid_block_type"] = "UNetMidBlock2DCrossAttn"
    embedding = draw(st.sampled_from(["none", "labels", "timestep", "identity", "projection", "simple_projection",
                                      "text_time"]))
    if embedding == "labels":
        config["num_class_embeds"] = 3
    elif embedding == "text_time":
        config.update(addition_embed_type="text_time", addition_time_embed_dim=4, projection_class_embeddings_input_dim=6 + 3 * 4)
    elif embedding != "none":
        config.update(class_embed_type=embedding, projection_class_embeddings_input_dim=7,
                      class_embeddings_concat=draw(st.booleans()))
    return config


@given(configs())
def test_drawn_configs_equal_diffusers(tmp_path_factory, config) -> None:
    theirs, ours = twins(config, tmp_path_factory.mktemp("unet"))
    values = inputs(config)
    if config.get("addition_embed_type") == "text_time":
        values["text_embeds"], values["time_ids"] = randn(2, 6, seed=8), np.array([[4, 8, 0], [16, 2, 1]], np.float32)
    assert max_error(ours, theirs, values) <= TOLERANCE


# config.json of released checkpoints, as diffusers wrote them (the keys that differ from the defaults,
# and the nulls later diffusers versions write)
RELEASED = {
    "sd-1.5": dict(cross_attention_dim=768, attention_head_dim=8, sample_size=64),
    "sd-2.1": dict(cross_attention_dim=1024, attention_head_dim=[5, 10, 20, 20], use_linear_projection=True,
                   upcast_attention=True, sample_size=96, dual_cross_attention=False, num_class_embeds=None,
                   only_cross_attention=False, class_embed_type=None, resnet_time_scale_shift="default"),
    "sdxl": dict(addition_embed_type="text_time", addition_embed_type_num_heads=64, addition_time_embed_dim=256,
                 attention_head_dim=[5, 10, 20], block_out_channels=[320, 640, 1280], cross_attention_dim=2048,
                 cross_attention_norm=None, down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
                 encoder_hid_dim=None, encoder_hid_dim_type=None, mid_block_only_cross_attention=None,
                 num_attention_heads=None, projection_class_embeddings_input_dim=2816, sample_size=128,
                 time_cond_proj_dim=None, time_embedding_act_fn=None, time_embedding_dim=None, timestep_post_act=None,
                 transformer_layers_per_block=[1, 2, 10], upcast_attention=None, use_linear_projection=True,
                 up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"]),
    "lcm-sdxl": dict(addition_embed_type="text_time", addition_time_embed_dim=256, attention_head_dim=[5, 10, 20],
                     block_out_channels=[320, 640, 1280], cross_attention_dim=2048,
                     down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
                     projection_class_embeddings_input_dim=2816, time_cond_proj_dim=256,
                     transformer_layers_per_block=[1, 2, 10], use_linear_projection=True,
                     up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"]),
}


@pytest.mark.parametrize("name", list(RELEASED))
def test_released_configs_pass_every_check(name) -> None:
    """The full-size configs are checked as from_pretrained checks them (building them is the GPU tests' job)."""
    released = RELEASED[name]
    values = {k: p.default for k, p in inspect.signature(UNet2DConditionModel.__init__).parameters.items() if k != "self"}
    values.update(json.loads(json.dumps(released)))
    check_bounds("UNet2DConditionModel", values, UNet2DConditionModel.config_bounds, UNet2DConditionModel.parameter_shares)
    check_config(values)
    heads = [level.heads for level in levels(values)]
    assert heads == (released["attention_head_dim"] if isinstance(released["attention_head_dim"], list) else [8] * 4)


@pytest.mark.parametrize("key, value, message", [
    ("dual_cross_attention", True, "dual_cross_attention"),
    ("down_block_types", ("CrossAttnDownBlock2D", "SimpleCrossAttnDownBlock2D"), "SimpleCrossAttnDownBlock2D"),
    ("attention_head_dim", (2, 4, 8), "attention_head_dim has 3 entries"),
    ("addition_embed_type", "text", "addition_embed_type"),
    ("encoder_hid_dim", 12, "encoder_hid_dim"),
    ("transformer_layers_per_block", ((1, 1), 1), "reverse_transformer_layers_per_block"),
    ("conv_in_kernel", 2, "conv_in_kernel"),
])
def test_bad_configs_raise_naming_the_key(key, value, message) -> None:
    with pytest.raises(ValueError, match=message):
        UNet2DConditionModel(**{**FAMILIES["sd1"], key: value})


def test_bad_inputs_raise_naming_the_argument() -> None:
    model = UNet2DConditionModel(**FAMILIES["sdxl"])
    values = inputs(FAMILIES["sdxl"])
    x, t, states = tc.tensor(values["sample"]), tc.tensor(values["timestep"]), tc.tensor(values["encoder_hidden_states"])
    added = {"text_embeds": tc.tensor(values["text_embeds"]), "time_ids": tc.tensor(values["time_ids"])}
    with pytest.raises(ValueError, match="encoder_hidden_states must be"):
        model(x, t, states[:, :, :8], added_cond_kwargs=added)
    with pytest.raises(ValueError, match=r"added_cond_kwargs \['time_ids'\]"):
        model(x, t, states, added_cond_kwargs={"text_embeds": added["text_embeds"]})
    with pytest.raises(ValueError, match="time_ids"):
        model(x, t, states, added_cond_kwargs={**added, "time_ids": added["time_ids"][:, :4]})
    with pytest.raises(ValueError, match="timestep_cond"):
        model(x, t, states, added_cond_kwargs=added, timestep_cond=tc.zeros(2, 8))
    with pytest.raises(ValueError, match="cross_attention_kwargs"):
        model(x, t, states, added_cond_kwargs=added, cross_attention_kwargs={"scale": 0.5})
    with pytest.raises(ValueError, match=r"sample must be \[B, 4, H, W\]"):
        model(tc.zeros(2, 3, 8, 8), t, states, added_cond_kwargs=added)
    with pytest.raises(ValueError, match="class_labels"):
        model(x, t, states, added_cond_kwargs=added, class_labels=[0, 1])


def test_bad_folders_raise_and_load_nothing(tmp_path) -> None:
    config = FAMILIES["sd1"]
    twins(config, tmp_path / "good")
    folder = tmp_path / "bad"
    folder.mkdir()
    text = (tmp_path / "good" / CONFIG_NAME).read_text()
    (folder / CONFIG_NAME).write_text(text.replace('"UNet2DConditionModel"', '"UNet2DModel"'))
    with pytest.raises(ValueError, match="UNet2DModel"):
        UNet2DConditionModel.from_pretrained(folder)
    (folder / CONFIG_NAME).write_text(text)
    (folder / "diffusion_pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(ValueError, match="safetensors"):
        UNet2DConditionModel.from_pretrained(folder)
    weights = (tmp_path / "good" / WEIGHTS_NAME).read_bytes()
    (folder / WEIGHTS_NAME).write_bytes(weights[:-64])
    with pytest.raises(ValueError):
        UNet2DConditionModel.from_pretrained(folder)
    (folder / WEIGHTS_NAME).unlink()
    theirs = diffusers.UNet2DConditionModel(**config)
    theirs.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    shards = sorted((tmp_path / "sharded").glob("*-of-*.safetensors"))
    assert len(shards) > 1
    shards[-1].unlink()
    with pytest.raises(FileNotFoundError, match=shards[-1].name):
        UNet2DConditionModel.from_pretrained(tmp_path / "sharded")


def test_unknown_config_keys_warn(tmp_path) -> None:
    folder = tmp_path / "model"
    UNet2DConditionModel(**FAMILIES["sd1"]).save_pretrained(folder)
    config = json.loads((folder / CONFIG_NAME).read_text())
    (folder / CONFIG_NAME).write_text(json.dumps({**config, "made_up_key": 1, "_diffusers_version": "0.42.1"}))
    with pytest.warns(UserWarning, match="made_up_key"):
        UNet2DConditionModel.from_pretrained(folder)
