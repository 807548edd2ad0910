"""UNet2DConditionModel on the GPU (CuPy backend) against diffusers on the same weights: the full
SD-1.5 and SDXL UNet configs in float32, float16 and bfloat16, and tiny configs of every family.

diffusers runs with torch on the GPU when torch sees one, else on the CPU, always in float32
without TF32, so it is the exact reference.  Bounds are on ``max |ours - diffusers|`` relative
to ``max |diffusers|``: 1e-3 in float32; in half precision the rounding of activations
compounds through the network, and the bounds are 2e-2 (float16) and 1e-1 (bfloat16, three
fewer mantissa bits).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

import tensorcore as tc
from diffusion import UNet2DConditionModel
from test_models_unet_condition import FAMILIES, call, inputs, twins

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

SD15 = dict(sample_size=64, cross_attention_dim=768, attention_head_dim=8)  # the rest are diffusers' defaults
SDXL = dict(sample_size=128, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            block_out_channels=(320, 640, 1280), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
            transformer_layers_per_block=(1, 2, 10), use_linear_projection=True, addition_embed_type="text_time",
            addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816)
BOUNDS = {tc.float32: 1e-3, tc.float16: 2e-2, tc.bfloat16: 1e-1}


def reference_device() -> str:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return "cuda" if torch.cuda.is_available() else "cpu"


def full_inputs(config: dict) -> dict[str, np.ndarray]:
    """One 64x64 latent, 77 text states and, for SDXL, its pooled text embedding and size conditions."""
    rng = np.random.default_rng(0)
    values = {"sample": rng.standard_normal((1, 4, 64, 64)).astype(np.float32), "timestep": np.array([501]),
              "encoder_hidden_states": rng.standard_normal((1, 77, config["cross_attention_dim"])).astype(np.float32)}
    if config.get("addition_embed_type") == "text_time":
        values["text_embeds"] = rng.standard_normal((1, 1280)).astype(np.float32)
        values["time_ids"] = np.array([[1024, 1024, 0, 0, 1024, 1024]], dtype=np.float32)
    return values


def reference(theirs, values: dict[str, np.ndarray], device: str, dtype=None) -> np.ndarray:
    """diffusers' output on ``device`` (floating inputs in ``dtype`` when given), as float32 NumPy."""
    make = {k: torch.tensor(v, device=device, dtype=dtype if v.dtype.kind == "f" else None) for k, v in values.items()}
    added = {k: make[k] for k in ("text_embeds", "time_ids") if k in make}
    with torch.no_grad():
        out = theirs(make["sample"], make["timestep"], make["encoder_hidden_states"],
                     added_cond_kwargs=added or None).sample
    return out.float().cpu().numpy()


def full_twins(config: dict) -> tuple:
    """(diffusers model, ours) with the same weights: diffusers' initialisation, every tensor moved
    by half its own spread (norm weights and zero-initialised tensors by 0.1)."""
    torch.manual_seed(0)
    theirs = diffusers.UNet2DConditionModel(**config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in theirs.parameters():
            spread = float(p.std()) if p.numel() > 1 else 0.0
            p.add_(torch.randn(p.shape, generator=generator) * (0.5 * spread if spread > 0 else 0.1))
    ours = UNet2DConditionModel(**config).eval()
    ours.load_state_dict({k: tc.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
    return theirs, ours


@pytest.fixture(scope="module")
def full_models():
    """name -> (ours in float32 on the host, inputs, diffusers' float32 output, notes), built once per config."""
    cache: dict[str, tuple] = {}

    def get(name: str) -> tuple:
        if name not in cache:
            config, device = {"sd15": SD15, "sdxl": SDXL}[name], reference_device()
            theirs, ours = full_twins(config)
            values = full_inputs(config)
            expected = reference(theirs.to(device), values, device)
            notes = {}
            if device == "cuda":  # diffusers' own float16 error, for scale
                half = reference(theirs.half(), values, device, torch.float16)
                notes["diffusers float16"] = float(np.abs(half - expected).max() / np.abs(expected).max())
                theirs.to("cpu")  # the GPU is shared with other test processes: hand its memory back
                torch.cuda.empty_cache()
            cache[name] = (ours, values, expected, notes)
        return cache[name]

    yield get
    cache.clear()


@pytest.mark.parametrize("dtype", list(BOUNDS), ids=str)
@pytest.mark.parametrize("name", ["sd15", "sdxl"])
def test_full_config_equals_diffusers(full_models, name, dtype) -> None:
    ours, values, expected, notes = full_models(name)
    gpu = copy.deepcopy(ours).to("cuda", dtype)
    actual = call(gpu, values, on_gpu(dtype)).astype(np.float32)
    del gpu
    tc.cuda.empty_cache()  # the full configs take gigabytes of a GPU other test processes share
    error = float(np.abs(actual - expected).max() / np.abs(expected).max())
    assert error <= BOUNDS[dtype], f"{name} {dtype}: relative error {error:.3g} > {BOUNDS[dtype]} ({notes})"


def on_gpu(dtype=tc.float32):
    """``tc.tensor`` on the GPU, floating arrays in ``dtype``."""
    return lambda v: tc.tensor(v, device="cuda", dtype=dtype if v.dtype.kind == "f" else None)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tiny_families_on_cupy_equal_diffusers(family, tmp_path: Path) -> None:
    config = FAMILIES[family]
    theirs, ours = twins(config, tmp_path)
    values = inputs(config)
    expected = call(theirs, values, torch.tensor)
    assert np.abs(call(ours.to("cuda"), values, on_gpu()) - expected).max() <= 2e-4
    half = call(ours.to(tc.float16), values, on_gpu(tc.float16)).astype(np.float32)
    assert np.abs(half - expected).max() <= BOUNDS[tc.float16] * np.abs(expected).max()


def test_from_pretrained_places_half_weights_on_the_gpu(tmp_path: Path) -> None:
    config = FAMILIES["sdxl"]
    theirs, _ = twins(config, tmp_path, variant="fp16")
    ours = UNet2DConditionModel.from_pretrained(tmp_path, dtype=tc.float16, device="cuda", variant="fp16")
    assert ours.dtype == tc.float16 and ours.device == "cuda"
    values = inputs(config)
    expected = call(theirs, values, torch.tensor)
    actual = call(ours, values, on_gpu(tc.float16)).astype(np.float32)
    assert np.abs(actual - expected).max() <= BOUNDS[tc.float16] * np.abs(expected).max()
