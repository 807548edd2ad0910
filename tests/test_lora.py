"""LoRA adapters (diffusion.lora) on the tiny SD UNet and CLIP text encoder.

Against diffusers (with PEFT) as the oracle, on the same base weights and the same LoRA
files: outputs after ``load_lora_weights`` (PEFT file with lora_alpha != r in the
metadata; the same LoRA in kohya keys with ``.alpha``), after ``fuse_lora``, with two
adapters and ``set_adapters`` weights, with a LoRA scale, with PEFT's ``alpha_pattern``,
``rank_pattern`` and ``use_rslora``, each within 1e-4 of the largest output value.
Without an oracle: ``unfuse_lora`` + ``unload_lora_weights`` give the base outputs bit for
bit, compiled models fuse the LoRA matmuls and retrace on changes, the bookkeeping of
adapter names, and bad files raise before any model changes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

import tensorcore as tc
from diffusion import CLIPTextModel, UNet2DConditionModel
from diffusion.lora import LoraConv2d, LoraLayer, LoraLinear, LoraLoaderMixin, LoraWeights
from layers import Conv2d, Linear, Module
from layers.serialization import load_file, save_file
from models_oracle import assert_close, perturbed, randn

UNET = dict(block_out_channels=(32, 64), layers_per_block=2, sample_size=32, in_channels=4, out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32, norm_num_groups=32)
TEXT = dict(hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=5, vocab_size=1000,
            bos_token_id=0, eos_token_id=2, pad_token_id=1)
UNET_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj", "ff.net.2",
                "conv1", "conv2", "conv", "conv_shortcut", "time_emb_proj"]
TEXT_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
SAMPLE, CONTEXT, TIMESTEPS = randn(2, 4, 16, 16, seed=1), randn(2, 7, 32, seed=2), np.array([10, 500])
IDS = np.array([[0, 5, 17, 999, 40, 2, 2], [0, 8, 300, 12, 2, 1, 1]])
REL = 1e-4  # of the largest output value, float32
# PEFT's note that a model gets a second adapter (the fixture's LoRAs, diffusers loading two)
pytestmark = pytest.mark.filterwarnings("ignore:Already found a `peft_config`")
WEIGHTS_NAME = "pytorch_lora_weights.safetensors"


class Host(LoraLoaderMixin):
    """The least a pipeline holds for LoRA."""

    def __init__(self, unet, text_encoder) -> None:
        self.unet, self.text_encoder = unet, text_encoder


def ours(host: Host) -> tuple[np.ndarray, np.ndarray]:
    """(UNet output, text encoder last hidden state) of our models."""
    with tc.no_grad():
        unet = host.unet(tc.tensor(SAMPLE), tc.tensor(TIMESTEPS), tc.tensor(CONTEXT)).numpy()
        return unet, host.text_encoder(IDS).last_hidden_state.numpy()


def both_close(got: tuple, want: tuple) -> None:
    for a, b in zip(got, want):
        assert_close(a, b, REL)


def adapted(*models) -> list[LoraLayer]:
    return [m for model in models for m in model.modules() if isinstance(m, LoraLayer)]


# ----- the oracle: diffusers, transformers and PEFT ------------------------------------------
@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Base weights (``unet/``, ``text_encoder/``) as diffusers and transformers save them, and two
    PEFT LoRAs saved by diffusers' ``save_lora_weights`` with their metadata: ``a/`` (r 4, alpha 8,
    every target) and ``b/`` (r 2, alpha 3, the attention projections only)."""
    torch = pytest.importorskip("torch")
    diffusers, transformers = pytest.importorskip("diffusers"), pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from peft.utils import get_peft_model_state_dict

    root = tmp_path_factory.mktemp("lora")
    torch.manual_seed(0)
    unet = perturbed(diffusers.UNet2DConditionModel(**UNET), 0)
    unet.save_pretrained(root / "unet")
    text = perturbed(transformers.CLIPTextModel(transformers.CLIPTextConfig(**TEXT)), 1)
    text.save_pretrained(root / "text_encoder")
    loras = (("a", 4, 8, UNET_TARGETS, TEXT_TARGETS), ("b", 2, 3, UNET_TARGETS[:4], ["q_proj", "v_proj"]))
    for name, rank, alpha, unet_targets, text_targets in loras:
        unet_config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=unet_targets, init_lora_weights=False)
        text_config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=text_targets, init_lora_weights=False)
        unet.add_adapter(unet_config, adapter_name=name)
        peft.inject_adapter_in_model(text_config, text, adapter_name=name)
        text_layers = {k.replace(f".{name}.", "."): v for k, v in text.state_dict().items() if f"lora_A.{name}." in k
                       or f"lora_B.{name}." in k}
        diffusers.StableDiffusionPipeline.save_lora_weights(
            root / name, unet_lora_layers=get_peft_model_state_dict(unet, adapter_name=name),
            text_encoder_lora_layers=text_layers, safe_serialization=True,
            unet_lora_adapter_metadata=unet_config.to_dict(), text_encoder_lora_adapter_metadata=text_config.to_dict())
    return root


def our_host(root: Path) -> Host:
    return Host(UNet2DConditionModel.from_pretrained(root / "unet"),
                CLIPTextModel.from_pretrained(root / "text_encoder"))


def diffusers_pipeline(root: Path):
    """diffusers' StableDiffusionPipeline holding just the UNet and the text encoder."""
    import diffusers
    import transformers

    return diffusers.StableDiffusionPipeline(
        vae=None, text_encoder=transformers.CLIPTextModel.from_pretrained(root / "text_encoder").eval(), tokenizer=None,
        unet=diffusers.UNet2DConditionModel.from_pretrained(root / "unet").eval(), scheduler=None,
        safety_checker=None, feature_extractor=None, requires_safety_checker=False)


def theirs(pipe, scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """diffusers' outputs; ``scale`` as a pipeline applies a LoRA scale (``scale_lora_layers``)."""
    import torch
    from diffusers.utils import scale_lora_layers, unscale_lora_layers

    with torch.no_grad():
        kwargs = {} if scale is None else {"cross_attention_kwargs": {"scale": scale}}
        unet = pipe.unet(torch.from_numpy(SAMPLE), torch.from_numpy(TIMESTEPS), torch.from_numpy(CONTEXT), **kwargs)
        if scale is not None:
            scale_lora_layers(pipe.text_encoder, scale)
        text = pipe.text_encoder(torch.from_numpy(IDS)).last_hidden_state.numpy()
        if scale is not None:
            unscale_lora_layers(pipe.text_encoder, scale)
    return unet.sample.numpy(), text


def test_peft_lora_matches_diffusers_loaded_fused_and_unloaded(folder) -> None:
    host, pipe = our_host(folder), diffusers_pipeline(folder)
    base = ours(host)
    names = {n: p for n, p in host.unet.named_parameters()}
    version = host.unet.structure_version
    host.load_lora_weights(folder / "a")
    pipe.load_lora_weights(folder / "a")
    assert host.unet.structure_version != version
    listed = {"unet": ["default_0"], "text_encoder": ["default_0"]}
    assert host.get_list_adapters() == pipe.get_list_adapters() == listed
    assert host.get_active_adapters() == pipe.get_active_adapters() == ["default_0"]
    loaded = ours(host)
    both_close(loaded, theirs(pipe))
    assert all(np.abs(a - b).max() > 0.1 * np.abs(b).max() for a, b in zip(loaded, base))  # the LoRA counts
    assert {n: p for n, p in host.unet.named_parameters()} == names  # same names, same Parameter objects

    host.fuse_lora()
    pipe.fuse_lora()
    both_close(ours(host), theirs(pipe))
    host.unfuse_lora()
    pipe.unfuse_lora()
    for a, b in zip(ours(host), loaded):
        np.testing.assert_array_equal(a, b)
    host.fuse_lora(lora_scale=0.7)
    pipe.fuse_lora(lora_scale=0.7)
    both_close(ours(host), theirs(pipe))

    host.unfuse_lora()
    host.unload_lora_weights()
    assert not adapted(host.unet, host.text_encoder) and host.get_list_adapters() == {}
    assert {n: p for n, p in host.unet.named_parameters()} == names
    for a, b in zip(ours(host), base):
        np.testing.assert_array_equal(a, b)


def to_kohya(arrays: dict[str, np.ndarray], alpha: float) -> dict[str, np.ndarray]:
    """A diffusers/PEFT LoRA in kohya's keys, with ``alpha`` written for every module."""
    kohya = {}
    for key, value in arrays.items():
        component, _, rest = key.partition(".")
        module, factor = re.fullmatch(r"(.+)\.lora_([AB])\.weight", rest).groups()
        if component == "text_encoder" and not module.startswith("text_model."):
            module = "text_model." + module  # kohya names transformers' module tree as transformers 4 built it
        name = {"unet": "lora_unet_", "text_encoder": "lora_te_"}[component] + module.replace(".", "_")
        kohya[f"{name}.lora_{'down' if factor == 'A' else 'up'}.weight"] = value
        kohya[f"{name}.alpha"] = np.array(alpha, np.float32)
    return kohya


def test_kohya_keys_load_the_same_lora(folder, tmp_path) -> None:
    save_file(to_kohya(load_file(folder / "a" / WEIGHTS_NAME), alpha=8.0), tmp_path / "kohya.safetensors")
    host = our_host(folder)
    host.load_lora_weights(folder / "a")
    want = ours(host)
    host.unload_lora_weights()
    host.load_lora_weights(tmp_path / "kohya.safetensors")
    got = ours(host)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    pipe = diffusers_pipeline(folder)
    pipe.load_lora_weights(tmp_path, weight_name="kohya.safetensors")
    assert_close(got[0], theirs(pipe)[0], REL)


def test_two_adapters_weights_scale_and_deletion_match_diffusers(folder) -> None:
    host, pipe = our_host(folder), diffusers_pipeline(folder)
    for name in ("a", "b"):
        host.load_lora_weights(folder / name, adapter_name=name)
        pipe.load_lora_weights(folder / name, adapter_name=name)
    assert host.get_active_adapters() == pipe.get_active_adapters() == ["b"]
    both_close(ours(host), theirs(pipe))
    host.set_adapters(["a", "b"], [0.5, 1.2])
    pipe.set_adapters(["a", "b"], [0.5, 1.2])
    both_close(ours(host), theirs(pipe))
    host.set_lora_scale(0.3)
    both_close(ours(host), theirs(pipe, scale=0.3))
    host.set_lora_scale(1.0)
    host.delete_adapters("b")
    pipe.delete_adapters("b")
    assert host.get_active_adapters() == pipe.get_active_adapters() == ["a"]
    assert host.get_list_adapters() == pipe.get_list_adapters()
    both_close(ours(host), theirs(pipe))


def test_alpha_pattern_rank_pattern_and_rslora_match_diffusers(folder, tmp_path) -> None:
    """PEFT's per-module alphas and ranks and rsLoRA's alpha / sqrt(r) from the metadata; without
    metadata diffusers applies the update in full (alpha = r), as we do."""
    import diffusers
    import peft
    from peft.utils import get_peft_model_state_dict

    unet = diffusers.UNet2DConditionModel.from_pretrained(folder / "unet")
    config = peft.LoraConfig(r=4, lora_alpha=6, alpha_pattern={"to_q": 2.0}, rank_pattern={"to_k": 2}, use_rslora=True,
                             target_modules=UNET_TARGETS[:4], init_lora_weights=False)
    unet.add_adapter(config)
    layers = get_peft_model_state_dict(unet)
    for name, metadata in (("with_metadata", config.to_dict()), ("without", None)):
        diffusers.StableDiffusionPipeline.save_lora_weights(tmp_path / name, unet_lora_layers=layers,
                                                            unet_lora_adapter_metadata=metadata)
        host, pipe = our_host(folder), diffusers_pipeline(folder)
        host.load_lora_weights(tmp_path / name)
        pipe.load_lora_weights(tmp_path / name)
        assert_close(ours(host)[0], theirs(pipe)[0], REL)


# ----- without an oracle -------------------------------------------------------------------------
TARGETS = re.compile(r"\.(to_[qkv]|to_out\.0|proj_(in|out)|ff\.net\.(0\.proj|2)|conv[12]|[qkv]_proj|out_proj|fc[12])$")


def random_lora(component: str, model: Module, rank: int, seed: int) -> dict[str, np.ndarray]:
    """A diffusers/PEFT LoRA state dict of random factors for the usual targets of ``model``."""
    rng, arrays = np.random.default_rng(seed), {}
    for name, module in model.named_modules():
        if not TARGETS.search(name) or not isinstance(module, (Linear, Conv2d)):
            continue
        if isinstance(module, Linear):
            down, up = (rank, module.in_features), (module.out_features, rank)
        else:
            down, up = (rank, module.in_channels, *module.kernel_size), (module.out_channels, rank, 1, 1)
        arrays[f"{component}.{name}.lora_A.weight"] = rng.standard_normal(down).astype(np.float32) * 0.3
        arrays[f"{component}.{name}.lora_B.weight"] = rng.standard_normal(up).astype(np.float32) * 0.3
    return arrays


@pytest.fixture
def host() -> Host:
    tc.manual_seed(0)
    return Host(UNet2DConditionModel(**UNET).eval(), CLIPTextModel(**TEXT).eval())


def test_compiled_unet_fuses_the_lora_matmuls_and_retraces_on_changes(host) -> None:
    unet = host.unet
    compiled = tc.compile(unet, cache_dir=False)
    host = Host(compiled, host.text_encoder)
    host.load_lora_weights(random_lora("unet", unet, 4, seed=1), adapter_name="a")
    host.load_lora_weights(random_lora("unet", unet, 2, seed=2), adapter_name="b")
    inputs = tc.tensor(SAMPLE), tc.tensor(TIMESTEPS), tc.tensor(CONTEXT)
    changes = [lambda: None, lambda: host.set_adapters(["a", "b"], [0.5, 1.2]), lambda: host.fuse_lora(lora_scale=0.8)]
    results = []
    with tc.no_grad():
        for traces, change in enumerate(changes, start=1):
            change()
            got, want = compiled(*inputs).numpy(), unet(*inputs).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
            assert compiled.cache_info().traces == traces
            results.append(got)
    assert compiled.plan_info()[0]["passes"].get("lora", 0) > 0  # one active adapter: fused LoRA calls
    assert compiled.cache_info().rewrites.get("lora", 0) > 0
    assert "lora" not in compiled.plan_info()[-1]["passes"]  # fused weights: the forward is the base alone
    assert all(np.abs(a - b).max() > 1e-2 * np.abs(b).max() for a, b in zip(results, results[1:]))


def test_adapted_linear_keeps_its_parameters_and_computes_the_update() -> None:
    tc.manual_seed(3)
    base = Linear(6, 5)
    params = dict(base.named_parameters())
    rng = np.random.default_rng(0)
    down, up = rng.standard_normal((3, 6)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    layer = LoraLinear(base)
    layer.add_adapter("x", LoraWeights(down, up, alpha=6.0, key="x.lora_A.weight"))
    layer.set_active({"x": 0.5})
    assert isinstance(layer, Linear) and dict(layer.named_parameters()) == params
    assert list(layer.state_dict()) == ["weight", "bias"] and len(list(layer.buffers())) == 2
    x = rng.standard_normal((4, 6)).astype(np.float32)
    weight, bias = base.weight.numpy().copy(), base.bias.numpy()
    want = x @ weight.T + bias + (x @ down.T @ up.T) * (0.5 * 6.0 / 3)
    with tc.no_grad():
        np.testing.assert_allclose(layer(tc.tensor(x)).numpy(), want, rtol=1e-5, atol=1e-5)
        layer.fuse({"x": 0.5})
        np.testing.assert_allclose(layer(tc.tensor(x)).numpy(), want, rtol=1e-5, atol=1e-5)
    assert layer.plain() is base
    np.testing.assert_array_equal(base.weight.numpy(), weight)


def test_adapter_names_activity_and_scale_bookkeeping(host) -> None:
    for seed in (1, 2):
        host.load_lora_weights(random_lora("text_encoder", host.text_encoder, 2, seed))
    host.load_lora_weights(random_lora("unet", host.unet, 2, 3), adapter_name="u")
    assert host.get_list_adapters() == {"unet": ["u"], "text_encoder": ["default_0", "default_1"]}
    assert host.get_active_adapters() == ["u"]
    versions = host.unet.structure_version, host.text_encoder.structure_version
    host.set_lora_scale(1.0)  # unchanged: no retrace
    assert (host.unet.structure_version, host.text_encoder.structure_version) == versions
    host.set_lora_scale(0.5)  # the text encoder's adapters are not active: only the UNet changes
    assert host.unet.structure_version != versions[0] and host.text_encoder.structure_version == versions[1]
    with pytest.raises(ValueError, match=r"no adapter named 'nope'; loaded: \['default_0', 'default_1', 'u'\]"):
        host.set_adapters(["default_0", "nope"])
    with pytest.raises(ValueError, match="set_adapters: 2 adapter names but 1 weights"):
        host.set_adapters(["default_0", "u"], [0.5])
    with pytest.raises(TypeError, match="set_adapters: adapter weight must be a number, got bool True"):
        host.set_adapters("u", True)
    host.set_adapters(["default_0", "u"], 0.5)
    host.fuse_lora()
    for op in (lambda: host.fuse_lora(), lambda: host.set_adapters("u"), lambda: host.delete_adapters("u"),
               lambda: host.load_lora_weights(random_lora("unet", host.unet, 2, 4))):
        with pytest.raises(ValueError, match="fused into the model; call unfuse_lora"):
            op()
    host.unfuse_lora()
    host.delete_adapters(["default_0", "u"])
    assert host.get_active_adapters() == ["default_1"] and host.get_list_adapters() == {"text_encoder": ["default_1"]}
    assert not adapted(host.unet) and all(layer.adapter_names == ["default_1"] for layer in adapted(host.text_encoder))
    host.load_lora_weights(random_lora("unet", host.unet, 2, 5))
    assert host.get_active_adapters() == ["default_2"]


def _write(path: Path, arrays: dict[str, np.ndarray], metadata: dict | None = None) -> Path:
    """``arrays`` as a safetensors file, with diffusers' adapter metadata when given."""
    header = None if metadata is None else {"lora_adapter_metadata": json.dumps(metadata)}
    safetensors.numpy.save_file(arrays, str(path), metadata=header)
    return path


@pytest.mark.parametrize("case, error", [
    ("bin", r"'.*pytorch_lora_weights\.bin' is not a \.safetensors file"),
    ("unknown_module", r"'unet\.down_blocks\.1\.attentions\.0\.to_q\.lora_A\.weight' names "
                       r"'down_blocks\.1\.attentions\.0\.to_q', which is no Linear or ungrouped Conv2d of the unet"),
    ("kohya_unknown", r"'lora_unet_input_blocks_4_1_proj_in\.lora_down\.weight' names 'input_blocks_4_1_proj_in'"),
    ("wrong_in", r"'unet\.down_blocks\.1\.attentions\.0\.proj_in\.lora_A\.weight' has shape \(4, 63, 1, 1\), but "
                 r"'down_blocks\.1\.attentions\.0\.proj_in' \(Conv2d\(64, 64, .*\)\) takes \(4, 64, 1, 1\)"),
    ("wrong_rank", r"'unet\..*proj_in\.lora_B\.weight' has shape \(64, 3, 1, 1\), .* takes \(64, 4, 1, 1\)"),
    ("missing_up", r"'unet\..*proj_in\.lora_A\.weight' comes without the up factor of 'down_blocks\.1\..*proj_in'"),
    ("not_lora", r"'unet\.conv_in\.weight' is not a LoRA key"),
    ("no_component", r"'vae\.encoder\.conv_in\.lora_A\.weight' names no component"),
    ("absent_component", r"'text_encoder_2\..*' adapts the text_encoder_2, which this pipeline does not have"),
    ("bad_alpha", r"'unet\..*proj_in\.alpha' must hold one finite number"),
    ("duplicate", r"an adapter named 'a' is already loaded"),
    ("dora", r"the unet's adapter is a DoRA \(use_dora\), which is not supported"),
    ("strings", r"'unet\.x\.lora_A\.weight' holds <U1 values; LoRA weights are numbers"),
])
def test_bad_sources_raise_and_change_nothing(host, tmp_path, case, error) -> None:
    good = random_lora("unet", host.unet, 4, seed=1)
    proj_in = "unet.down_blocks.1.attentions.0.proj_in"
    sources = {
        "bin": _write(tmp_path / "pytorch_lora_weights.bin", good),
        "unknown_module": {**good, "unet.down_blocks.1.attentions.0.to_q.lora_A.weight": np.zeros((4, 64), np.float32)},
        "kohya_unknown": {"lora_unet_input_blocks_4_1_proj_in.lora_down.weight": np.zeros((4, 64), np.float32)},
        "wrong_in": {**good, f"{proj_in}.lora_A.weight": np.zeros((4, 63, 1, 1), np.float32)},
        "wrong_rank": {**good, f"{proj_in}.lora_B.weight": np.zeros((64, 3, 1, 1), np.float32)},
        "missing_up": {k: v for k, v in good.items() if k != f"{proj_in}.lora_B.weight"},
        "not_lora": {**good, "unet.conv_in.weight": np.zeros((32, 4, 3, 3), np.float32)},
        "no_component": {**good, "vae.encoder.conv_in.lora_A.weight": np.zeros((4, 4, 3, 3), np.float32)},
        "absent_component": {**good, **random_lora("text_encoder_2", host.text_encoder, 2, seed=2)},
        "bad_alpha": {**good, f"{proj_in}.alpha": np.array(np.nan, np.float32)},
        "duplicate": _write(tmp_path / "a.safetensors", good),
        "dora": _write(tmp_path / "dora.safetensors", good,
                       metadata={"unet.r": 4, "unet.lora_alpha": 8, "unet.use_dora": True}),
        "strings": {"unet.x.lora_A.weight": np.array(["a"])},
    }
    if case == "duplicate":
        host.load_lora_weights(sources[case], adapter_name="a")
    before = [(model.structure_version, dict(model.named_modules())) for model in (host.unet, host.text_encoder)]
    adapters = host.get_list_adapters()
    with pytest.raises(TypeError if case == "strings" else ValueError, match=error):
        host.load_lora_weights(sources[case], adapter_name="a")
    after = [(model.structure_version, dict(model.named_modules())) for model in (host.unet, host.text_encoder)]
    assert after == before and host.get_list_adapters() == adapters


def test_conv_adapter_uses_the_base_stride_and_padding() -> None:
    """A 3×3 stride-2 convolution's update, checked against the fused weight's plain convolution."""
    tc.manual_seed(4)
    base = Conv2d(3, 5, 3, stride=2, padding=1)
    rng = np.random.default_rng(1)
    weights = LoraWeights(rng.standard_normal((2, 3, 3, 3)).astype(np.float32),
                          rng.standard_normal((5, 2, 1, 1)).astype(np.float32), alpha=None, key="k")
    layer = LoraConv2d(base)
    layer.add_adapter("x", weights)
    layer.set_active({"x": 1.5})
    x = tc.tensor(rng.standard_normal((1, 3, 9, 9)).astype(np.float32))
    with tc.no_grad():
        eager = layer(x).numpy()
        layer.fuse({"x": 1.5})
        fused = layer(x).numpy()
    assert eager.shape == (1, 5, 5, 5)
    np.testing.assert_allclose(eager, fused, rtol=1e-5, atol=1e-5)
