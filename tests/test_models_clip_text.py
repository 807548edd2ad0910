"""CLIPTextModel and CLIPTextModelWithProjection against transformers' own on the same weights:
tiny configs of both activations, the legacy and the modern EOS rule, padding masks, round
trips through transformers, variants and shards, bad folders and bad inputs; on the GPU the
full CLIP-L text config in float32 and float16."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import tensorcore as tc
from diffusion import CLIPTextModel, CLIPTextModelWithProjection
from models_oracle import as_numpy, perturbed

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# vocab 100: ids 96 and 97 are the start and end tokens of the modern config, 99 the largest id
TINY = dict(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=12, projection_dim=24, bos_token_id=96, eos_token_id=97, pad_token_id=1)
CLIP_L = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
              max_position_embeddings=77, projection_dim=768, hidden_act="quick_gelu")
# Sequences whose first end token (97) is not their largest id (99), so the two pooling rules differ;
# the first is padded with end tokens after its end, the second fills the whole length.
IDS = np.array([[96, 5, 99, 7, 97, 97, 97, 97], [96, 10, 11, 99, 13, 14, 15, 97]])
RIGHT_PADDING = (np.arange(8)[None] <= np.array([[4], [7]])).astype(np.int64)
LEFT_PADDING = np.array([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])


def transformers_twin(folder: Path, projection: bool, seed: int = 0, **config: object):
    """A transformers CLIP text model with perturbed random weights, saved into ``folder``."""
    torch.manual_seed(seed)
    cls = transformers.CLIPTextModelWithProjection if projection else transformers.CLIPTextModel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = perturbed(cls(transformers.CLIPTextConfig(**{**TINY, **config})), seed)
    theirs.save_pretrained(folder)
    return theirs


def outputs(model, ids: np.ndarray, mask: np.ndarray | None) -> dict[str, np.ndarray]:
    """The outputs both libraries name alike, as NumPy arrays (ours or transformers')."""
    if isinstance(model, torch.nn.Module):
        with torch.no_grad():
            out = model(torch.from_numpy(ids), attention_mask=None if mask is None else torch.from_numpy(mask),
                        output_hidden_states=True)
    else:
        out = model(ids, attention_mask=mask, output_hidden_states=True)
    pooled = out.text_embeds if hasattr(out, "text_embeds") else out.pooler_output
    return {"last_hidden_state": as_numpy(out.last_hidden_state), "pooled": as_numpy(pooled),
            "hidden_states": np.stack([as_numpy(h) for h in out.hidden_states])}


@pytest.mark.parametrize("act, projection, eos", [("quick_gelu", False, 97), ("gelu", True, 2)])
def test_matches_transformers(tmp_path, backend, act, projection, eos) -> None:
    theirs = transformers_twin(tmp_path, projection, hidden_act=act, eos_token_id=eos)
    device = "cuda" if backend == "cupy" else None
    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    ours = cls.from_pretrained(tmp_path, device=device)
    for mask in (None, RIGHT_PADDING, LEFT_PADDING):
        want, got = outputs(theirs, IDS, mask), outputs(ours, IDS, mask)
        assert got["hidden_states"].shape[0] == TINY["num_hidden_layers"] + 1
        for key in want:
            np.testing.assert_allclose(got[key], want[key], atol=2e-4, rtol=0, err_msg=f"{key}, mask {mask}")


def test_pooling_rule_follows_eos_token_id(tmp_path) -> None:
    """eos_token_id == 2 pools at the largest id (position 2 of IDS[0]), any other id at its first occurrence."""
    for eos, position in ((2, 2), (97, 4)):
        transformers_twin(tmp_path, False, eos_token_id=eos)
        out = CLIPTextModel.from_pretrained(tmp_path)(IDS)
        np.testing.assert_array_equal(out.pooler_output.numpy()[0], out.last_hidden_state.numpy()[0, position])


def test_outputs_read_by_name_and_position(tmp_path) -> None:
    transformers_twin(tmp_path, True)
    out = CLIPTextModelWithProjection.from_pretrained(tmp_path)(IDS, output_hidden_states=True)
    assert out[0] is out.text_embeds and out["last_hidden_state"] is out.last_hidden_state
    assert out[2] is out.hidden_states and len(out.to_tuple()) == 3
    assert CLIPTextModelWithProjection.from_pretrained(tmp_path)(IDS).hidden_states is None


@pytest.mark.parametrize("projection", [False, True])
def test_round_trip_through_transformers(tmp_path, projection) -> None:
    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    tc.manual_seed(3)
    ours = cls(**TINY, hidden_act="gelu").eval()
    ours.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [cls.__name__] and config["model_type"] == "clip_text_model"
    theirs_cls = transformers.CLIPTextModelWithProjection if projection else transformers.CLIPTextModel
    theirs, info = theirs_cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    want, got = outputs(theirs.eval(), IDS, RIGHT_PADDING), outputs(ours, IDS, RIGHT_PADDING)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=2e-4, rtol=0, err_msg=key)


def test_variants_and_shards_load(tmp_path) -> None:
    theirs = transformers_twin(tmp_path / "plain", False)
    theirs.save_pretrained(tmp_path / "fp16", variant="fp16")
    theirs.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "fp16" / "model.fp16.safetensors").exists()
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    want = CLIPTextModel.from_pretrained(tmp_path / "plain")(IDS).last_hidden_state.numpy()
    got_sharded = CLIPTextModel.from_pretrained(tmp_path / "sharded")(IDS).last_hidden_state.numpy()
    got_variant = CLIPTextModel.from_pretrained(tmp_path / "fp16", variant="fp16")(IDS).last_hidden_state.numpy()
    np.testing.assert_array_equal(got_sharded, want)
    np.testing.assert_array_equal(got_variant, want)
    CLIPTextModel.from_pretrained(tmp_path / "plain", dtype=tc.float16).save_pretrained(tmp_path / "ours", variant="fp16")
    theirs_fp16 = transformers.CLIPTextModel.from_pretrained(tmp_path / "ours", variant="fp16")
    assert theirs_fp16.dtype == torch.float16


def test_prefixed_keys_and_the_position_ids_buffer_load(tmp_path) -> None:
    """Checkpoints as older transformers wrote them (Stable Diffusion's): keys under ``text_model.``,
    an int64 ``text_model.embeddings.position_ids``, and config keys the model no longer reads."""
    from safetensors.numpy import load_file, save_file

    transformers_twin(tmp_path, False)
    weights = {f"text_model.{k}": v for k, v in load_file(tmp_path / "model.safetensors").items()}
    weights["text_model.embeddings.position_ids"] = np.arange(12, dtype=np.int64)[None]
    save_file(weights, tmp_path / "model.safetensors")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "dropout": 0.0, "torch_dtype": "float32"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = CLIPTextModel.from_pretrained(tmp_path)
    np.testing.assert_array_equal(model.text_model.embeddings.token_embedding.weight.numpy(),
                                  weights["text_model.embeddings.token_embedding.weight"])


def test_bad_folders_raise(tmp_path) -> None:
    from safetensors.numpy import load_file, save_file

    transformers_twin(tmp_path, False)
    config = json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(ValueError, match="describes a \\['CLIPTextModel'\\], not a CLIPTextModelWithProjection"):
        CLIPTextModelWithProjection.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "clip"}))
    with pytest.raises(ValueError, match="model_type 'clip', not 'clip_text_model'"):
        CLIPTextModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "flavour": 1}))
    with pytest.warns(UserWarning, match="unknown config keys \\['flavour'\\]"):
        CLIPTextModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights = load_file(tmp_path / "model.safetensors")
    fc1 = "encoder.layers.1.mlp.fc1.weight"
    save_file({k: v for k, v in weights.items() if k != fc1}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=f"missing keys: text_model.{fc1}"):
        CLIPTextModel.from_pretrained(tmp_path)
    save_file({**weights, fc1: weights[fc1][:, :5]}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=f"text_model.{fc1} \\(expected \\(48, 32\\), got \\(48, 5\\)\\)"):
        CLIPTextModel.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ValueError, match="never loaded; convert them to safetensors"):
        CLIPTextModel.from_pretrained(tmp_path)


def test_bad_configs_and_inputs_raise() -> None:
    with pytest.raises(ValueError, match="hidden_size=30 is not a multiple of num_attention_heads=4"):
        CLIPTextModel(**{**TINY, "hidden_size": 30})
    with pytest.raises(ValueError, match="'hidden_act' must be one of"):
        CLIPTextModel(**TINY, hidden_act="swish")
    with pytest.raises(ValueError, match="'num_hidden_layers' must be an int from 1 to 256, got 0"):
        CLIPTextModel(**{**TINY, "num_hidden_layers": 0})
    with pytest.raises(ValueError, match="'eos_token_id' must be an int from 0"):
        CLIPTextModel(**{**TINY, "eos_token_id": [2, 3]})
    model = CLIPTextModel(**TINY)
    with pytest.raises(TypeError, match="input_ids must hold integers"):
        model(IDS.astype(np.float32))
    with pytest.raises(ValueError, match="max_position_embeddings=12, got shape \\(1, 13\\)"):
        model(np.zeros((1, 13), dtype=np.int64))
    with pytest.raises(ValueError, match="more than the .* bytes of memory"):
        CLIPTextModel(**{**TINY, "vocab_size": 2 ** 24, "hidden_size": 2 ** 24 // 4, "num_attention_heads": 1})
    with pytest.raises(ValueError, match="attention_mask must match input_ids' shape"):
        model(IDS, attention_mask=RIGHT_PADDING[:, :4])


def clip_l_pair(tmp_path: Path, projection: bool = False):
    """transformers' CLIP-L text encoder (torch on the CPU, random weights moved by N(0, 0.02) so
    no norm or bias is trivial) saved into ``tmp_path``."""
    torch.manual_seed(0)
    config = transformers.CLIPTextConfig(**CLIP_L)
    theirs = (transformers.CLIPTextModelWithProjection if projection else transformers.CLIPTextModel)(config)
    perturbed(theirs, scale=0.02).save_pretrained(tmp_path)
    return theirs


def clip_l_ids() -> tuple[np.ndarray, np.ndarray]:
    """Two 77-token sequences, one padded with end tokens after its end, and their padding mask."""
    rng = np.random.default_rng(0)
    ids = np.full((2, 77), 49407, dtype=np.int64)
    ids[:, 0] = 49406
    ids[0, 1:20] = rng.integers(0, 49406, 19)
    ids[1, 1:76] = rng.integers(0, 49406, 75)
    mask = (np.arange(77)[None] <= np.array([[20], [76]])).astype(np.int64)
    return ids, mask


@pytest.mark.gpu
@pytest.mark.parametrize("projection", [False, True])
def test_clip_l_float32_on_the_gpu(tmp_path, projection) -> None:
    theirs = clip_l_pair(tmp_path, projection)
    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    with tc.use_backend("cupy"):
        ours = cls.from_pretrained(tmp_path, device="cuda")
        ids, mask = clip_l_ids()
        for m in (None, mask):
            want, got = outputs(theirs, ids, m), outputs(ours, ids, m)
            for key in want:
                np.testing.assert_allclose(got[key], want[key], atol=1e-3, rtol=0, err_msg=key)


# Half precision (float32 softmax) against transformers in float32: float16 keeps 11 significant
# bits, bfloat16 8, and the error grows over the 12 layers.
HALF_BOUNDS = {"float16": (5e-2, 2e-2), "bfloat16": (2e-1, 5e-2)}  # (atol, rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", sorted(HALF_BOUNDS))
def test_clip_l_half_precision_on_the_gpu(tmp_path, dtype) -> None:
    theirs = clip_l_pair(tmp_path, projection=True)
    atol, rtol = HALF_BOUNDS[dtype]
    with tc.use_backend("cupy"):
        ours = CLIPTextModelWithProjection.from_pretrained(tmp_path, dtype=getattr(tc, dtype), device="cuda")
        ids, mask = clip_l_ids()
        want, got = outputs(theirs, ids, mask), outputs(ours, ids, mask)
        for key in want:
            got32 = got[key].astype(np.float32)
            assert np.isfinite(got32).all(), key
            np.testing.assert_allclose(got32, want[key], atol=atol, rtol=rtol, err_msg=key)
