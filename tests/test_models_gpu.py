"""UNet2D and AutoencoderKL on the GPU (CuPy backend) against the NumPy backend, and the
memory a tiled 1024x1024 decode takes on the device."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import tensorcore as tc
import tensorcore.functional as F
from diffusion import AutoencoderKL, UNet2D
from models_oracle import SMALL_UNET, SMALL_VAE, assert_close, randn

pytestmark = pytest.mark.gpu


def forward_and_grads(model, device: str, call) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    out = call(model, device)
    cotangent = tc.tensor(randn(*out.shape, seed=9), device=device)
    (out * cotangent).sum().backward()
    return out.numpy(), {name: p.grad.numpy() for name, p in model.named_parameters()}


def check_against_numpy(model, call) -> None:
    gpu_model = copy.deepcopy(model).to("cuda")
    with tc.use_backend("numpy"):
        expected, expected_grads = forward_and_grads(model, "cpu", call)
    actual, actual_grads = forward_and_grads(gpu_model, "cuda", call)
    assert_close(actual, expected, 1e-4)
    scale = max(np.abs(g).max() for g in expected_grads.values())
    for name, grad in expected_grads.items():
        if name.endswith("to_k.bias"):  # zero up to rounding (softmax ignores a shift shared by all keys)
            assert np.abs(actual_grads[name] - grad).max() <= 1e-4 * scale, name
        else:
            assert_close(actual_grads[name], grad, 1e-3)


def test_unet_on_cupy_equals_numpy() -> None:
    unet = UNet2D(**{**SMALL_UNET, "cross_attention_dim": 6}).eval()
    x, context = randn(2, 3, 8, 8), randn(2, 5, 6, seed=2)

    def call(model, device):
        return model(tc.tensor(x, device=device), tc.tensor([4, 800], device=device), tc.tensor([0, 3], device=device),
                     context=tc.tensor(context, device=device))

    check_against_numpy(unet, call)


def test_vae_on_cupy_equals_numpy() -> None:
    vae = AutoencoderKL(**SMALL_VAE).eval()
    x = randn(2, 3, 16, 16)
    check_against_numpy(vae, lambda model, device: model(tc.tensor(x, device=device)))
    vae.enable_tiling()
    z = randn(1, 4, 20, 12)
    with tc.no_grad():
        expected = vae.decode(tc.tensor(z)).numpy()
        gpu_vae = copy.deepcopy(vae).to("cuda")
        assert_close(gpu_vae.decode(tc.tensor(z, device="cuda")), expected, 1e-4)


class PeakMemory:
    """Peak bytes held in CuPy's pool above the level at entry, tracked by a memory hook."""

    def __enter__(self) -> "PeakMemory":
        import cupy

        class Hook(cupy.cuda.MemoryHook):
            name = "peak_memory"

            def __init__(self) -> None:
                self.live = self.peak = 0

            def malloc_postprocess(self, **kwargs) -> None:
                self.live += kwargs["mem_size"]
                self.peak = max(self.peak, self.live)

            def free_postprocess(self, **kwargs) -> None:
                self.live -= kwargs["mem_size"]

        tc.cuda.synchronize()
        self.hook = Hook()
        self.hook.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        tc.cuda.synchronize()
        self.hook.__exit__(*exc)
        self.peak = self.hook.peak


def test_tiled_1024_decode_stays_within_one_tile_row_of_memory() -> None:
    vae = AutoencoderKL(block_out_channels=(32, 64, 64, 64), down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=32, sample_size=256).to("cuda").eval()
    vae.enable_tiling()  # 256-pixel tiles (32 latent), 6 per row of a 1024x1024 image
    z = tc.tensor(randn(1, 4, 128, 128), device="cuda")
    with tc.no_grad():
        with PeakMemory() as tiled:
            image = vae.decode(z)
        assert image.shape == (1, 3, 1024, 1024)
        del image
        vae.disable_tiling()
        with PeakMemory() as one_row:  # a band one tile high across the whole width, decoded at once
            vae.decode(z[:, :, :32])
        with PeakMemory() as whole:
            vae.decode(z)
    assert tiled.peak < one_row.peak, (tiled.peak, one_row.peak)
    assert tiled.peak < whole.peak / 3, (tiled.peak, whole.peak)
