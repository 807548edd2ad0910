"""UNet2D against diffusers' UNet2DModel on the same weights (loaded from a diffusers folder),
its config options, timestep and class-label forms, cross-attention, and input errors."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcore as tc
from diffusion import UNet2D
from models_oracle import REFERENCE_UNET, SMALL_UNET, as_numpy, assert_close, diffusers_twin, randn

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


def run_both(theirs, ours, x, t, labels=None, dtype=np.float32):
    with torch.no_grad():
        expected = theirs(torch.tensor(x), torch.tensor(t), class_labels=None if labels is None else torch.tensor(labels)).sample
    with tc.no_grad():
        actual = ours(tc.tensor(x, dtype=dtype), tc.tensor(t), class_labels=None if labels is None else tc.tensor(labels))
    return actual, expected


def test_small_unet_matches_diffusers_float32(backend, tmp_path) -> None:
    theirs, ours = diffusers_twin("unet", SMALL_UNET, tmp_path)
    actual, expected = run_both(theirs, ours, randn(2, 3, 8, 8), np.array([10, 999]), np.array([1, 4]))
    assert actual.dtype == tc.float32
    assert_close(actual, expected, 1e-4)


def test_small_unet_matches_diffusers_float64(tmp_path) -> None:
    theirs, ours = diffusers_twin("unet", SMALL_UNET, tmp_path, double=True)
    x = randn(2, 3, 8, 8, dtype=np.float64)
    # diffusers embeds timesteps in float32 (so do we); exp/sin ulps differ between torch and NumPy
    actual, expected = run_both(theirs, ours, x, np.array([10, 999]), np.array([1, 4]), np.float64)
    assert_close(actual, expected, 1e-6)
    # at t = 0 the embedding is exactly [1..1 | 0..0] on both sides, leaving float64 arithmetic alone
    actual, expected = run_both(theirs, ours, x, np.array([0, 0]), np.array([2, 0]), np.float64)
    assert_close(actual, expected, 1e-11)


VARIANTS = {
    "scale_shift+resnet_resampling+fourier": dict(
        resnet_time_scale_shift="scale_shift", downsample_type="resnet", upsample_type="resnet",
        time_embedding_type="fourier", num_class_embeds=None, class_embed_type="timestep", mid_block_scale_factor=2.0),
    "learned+no_mid+mish+identity_class": dict(
        time_embedding_type="learned", num_train_timesteps=1000, mid_block_type=None, act_fn="mish",
        num_class_embeds=None, class_embed_type="identity", time_embedding_dim=32),
    "mid_without_attention+gelu+options": dict(
        add_attention=False, act_fn="gelu", flip_sin_to_cos=False, freq_shift=1, center_input_sample=True,
        downsample_padding=0, attn_norm_num_groups=2, norm_eps=1e-3, attention_head_dim=None, dropout=0.3),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_config_options_match_diffusers(variant, tmp_path) -> None:
    config = {**SMALL_UNET, **VARIANTS[variant]}
    theirs, ours = diffusers_twin("unet", config, tmp_path, double=True)
    x = randn(2, 3, 8, 8, dtype=np.float64)
    t = np.array([3.0, 7.5]) if config.get("time_embedding_type") == "fourier" else np.array([3, 700])
    labels = {"timestep": np.array([5.0, 9.0]), "identity": randn(2, 32, seed=1, dtype=np.float64)}.get(
        config.get("class_embed_type"), np.array([1, 2]))
    actual, expected = run_both(theirs, ours, x, t, labels, np.float64)
    assert_close(actual, expected, 1e-6)
    assert {k: tuple(v.shape) for k, v in theirs.state_dict().items()} == {k: v.shape for k, v in ours.state_dict().items()}


def test_timestep_forms_agree(tmp_path) -> None:
    ours = UNet2D(**SMALL_UNET).eval()
    x, labels = tc.tensor(randn(3, 3, 8, 8)), tc.tensor([0, 1, 2])
    with tc.no_grad():
        per_batch = ours(x, tc.tensor([25, 25, 25]), labels).numpy()
        for form in (25, tc.tensor(25), tc.tensor([25]), tc.tensor(25.0), np.int64(25)):
            np.testing.assert_array_equal(ours(x, form, labels).numpy(), per_batch)
        distinct = ours(x, tc.tensor([1, 25, 900]), labels).numpy()
        np.testing.assert_array_equal(distinct[1], per_batch[1])
        assert not np.allclose(distinct[0], per_batch[0])


def test_timestep_tensor_is_never_read_to_the_host(monkeypatch) -> None:
    ours = UNet2D(**{**SMALL_UNET, "num_class_embeds": None}).eval()
    x, t = tc.tensor(randn(2, 3, 8, 8)), tc.tensor([3, 400])

    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read to the host during the forward")

    for name in ("numpy", "item", "tolist", "__array__", "__float__", "__int__", "__bool__", "__index__"):
        monkeypatch.setattr(tc.Tensor, name, refuse)
    with tc.no_grad():
        out = ours(x, t)
    monkeypatch.undo()
    assert np.isfinite(out.numpy()).all()


def test_cross_attention_attends_to_context() -> None:
    config = {**SMALL_UNET, "cross_attention_dim": 6}
    ours = UNet2D(**config).eval()
    plain = UNet2D(**SMALL_UNET)
    keys = set(ours.state_dict())
    extra = {k for k in keys if ".cross_attentions." in k}
    assert keys - extra == set(plain.state_dict())  # diffusers' keys untouched, cross-attention beside them
    assert {k.split(".cross_attentions.")[0] for k in extra} == {"down_blocks.1", "up_blocks.0", "mid_block"}
    x, t, labels = tc.tensor(randn(2, 3, 8, 8)), tc.tensor([5, 50]), tc.tensor([0, 1])
    ctx = tc.tensor(randn(2, 7, 6, seed=3), requires_grad=True)
    out = ours(x, t, labels, context=ctx)
    other = ours(x, t, labels, context=tc.tensor(randn(2, 7, 6, seed=4))).detach()
    assert not np.allclose(out.detach().numpy(), other.numpy())
    (out * out).sum().backward()
    assert np.abs(ctx.grad.numpy()).sum() > 0
    # zeroing every cross-attention output projection leaves the plain network
    plain.load_state_dict({k: v for k, v in ours.state_dict().items() if k not in extra})
    with tc.no_grad():
        for name, p in ours.named_parameters():
            if ".cross_attentions." in name and ".to_out.0." in name:
                p.zero_()
        np.testing.assert_allclose(ours(x, t, labels, context=ctx.detach()).numpy(), plain(x, t, labels).numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_cross_attention_layer_matches_diffusers_attention() -> None:
    from diffusers.models.attention_processor import Attention as DiffusersAttention
    from diffusion.models import Attention

    torch.manual_seed(0)
    theirs = DiffusersAttention(16, cross_attention_dim=6, heads=2, dim_head=8, norm_num_groups=4, eps=1e-5,
                                residual_connection=True, bias=True, _from_deprecated_attn_block=True).double().eval()
    ours = Attention(16, heads=2, dim_head=8, norm_num_groups=4, eps=1e-5, cross_attention_dim=6).double()
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    x, ctx = randn(2, 16, 4, 4, dtype=np.float64), randn(2, 5, 6, seed=1, dtype=np.float64)
    with torch.no_grad():
        expected = theirs(torch.tensor(x), encoder_hidden_states=torch.tensor(ctx))
    assert_close(ours(tc.tensor(x), tc.tensor(ctx)), expected, 1e-12)


def test_default_config_puts_attention_at_the_lowest_resolution_only() -> None:
    config = UNet2D(block_out_channels=(32, 32, 32, 32), norm_num_groups=8, attention_head_dim=8).config
    assert config.down_block_types == ("DownBlock2D", "DownBlock2D", "DownBlock2D", "AttnDownBlock2D")
    assert config.up_block_types == ("AttnUpBlock2D", "UpBlock2D", "UpBlock2D", "UpBlock2D")


@pytest.mark.parametrize("bad, match", [
    (dict(down_block_types=("DownBlock2D", "CrossAttnDownBlock2D")), "not supported"),
    (dict(block_out_channels=(16, 32, 64)), "same positive length"),
    (dict(resnet_time_scale_shift="spatial"), "resnet_time_scale_shift"),
    (dict(time_embedding_type="learned"), "num_train_timesteps"),
    (dict(attention_head_dim=5), "must divide"),
    (dict(act_fn="softsign"), "act_fn"),
    (dict(down_block_types=("DownBlock2D",) * 2, up_block_types=("UpBlock2D",) * 2, add_attention=False,
          cross_attention_dim=4), "attention layer"),
])
def test_bad_configs_raise(bad, match) -> None:
    with pytest.raises(ValueError, match=match):
        UNet2D(**{**SMALL_UNET, **bad})


def test_bad_inputs_raise() -> None:
    ours = UNet2D(**SMALL_UNET)
    x, t, labels = tc.tensor(randn(2, 3, 8, 8)), tc.tensor([1, 2]), tc.tensor([0, 1])
    with pytest.raises(ValueError, match=r"sample must be \[B, 3, H, W\]"):
        ours(tc.tensor(randn(2, 4, 8, 8)), t, labels)
    with pytest.raises(ValueError, match="multiples of 2"):
        ours(tc.tensor(randn(2, 3, 7, 8)), t, labels)
    with pytest.raises(ValueError, match="timestep must be a scalar or have shape"):
        ours(x, tc.tensor([1, 2, 3]), labels)
    with pytest.raises(TypeError, match="timestep must be a number or a Tensor"):
        ours(x, "7", labels)
    with pytest.raises(ValueError, match="class_labels are required"):
        ours(x, t)
    with pytest.raises(ValueError, match="no cross-attention"):
        ours(x, t, labels, context=tc.tensor(randn(2, 3, 4)))
    with pytest.raises(ValueError, match="no class embedding"):
        UNet2D(**{**SMALL_UNET, "num_class_embeds": None})(x, t, labels)
    with pytest.raises(ValueError, match=r"context must be \[2, L, 6\]"):
        UNet2D(**{**SMALL_UNET, "cross_attention_dim": 6})(x, t, labels, context=tc.tensor(randn(2, 3, 4)))


def test_reference_unet_has_the_benchmark_parameter_count() -> None:
    unet = UNet2D.reference()
    assert sum(p.numel() for p in unet.parameters()) == 57_569_284
    assert dict(unet.config) == {**dict(unet.config), **REFERENCE_UNET, "block_out_channels": (128, 256, 512),
                                 "down_block_types": ("DownBlock2D",) * 3, "up_block_types": ("UpBlock2D",) * 3}
    assert unet.mid_block.attentions[0].heads == 8


@pytest.mark.slow
def test_reference_unet_matches_diffusers(tmp_path) -> None:
    import diffusers

    torch.manual_seed(0)
    theirs = diffusers.UNet2DModel(**REFERENCE_UNET).eval()
    ours = UNet2D.reference().eval()
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    x = randn(1, 4, 32, 32)
    with torch.no_grad():
        expected = theirs(torch.tensor(x), 321).sample
    with tc.no_grad():
        actual = ours(tc.tensor(x), 321)
    assert_close(actual, expected, 1e-4)
