"""Small models and instrumented wrappers shared by the pipeline, training and CLI tests."""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

import tensorcore as tc
from diffusion import AutoencoderKL, UNet2D

NUM_CLASSES = 3  # tiny class-conditioned models: labels 0..2, null label 3


def tiny_unet(sample_size: int = 8, classes: int | None = NUM_CLASSES, cross_attention_dim: int | None = None,
              in_channels: int = 1, seed: int = 0) -> UNet2D:
    """A two-level UNet with attention at 4x4 (a few thousand parameters), in eval mode."""
    tc.manual_seed(seed)
    unet = UNet2D(sample_size=sample_size, in_channels=in_channels, out_channels=in_channels,
                  block_out_channels=(8, 16), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                  up_block_types=("AttnUpBlock2D", "UpBlock2D"), layers_per_block=1, norm_num_groups=4,
                  attention_head_dim=8, num_class_embeds=None if classes is None else classes + 1,
                  cross_attention_dim=cross_attention_dim)
    return unet.eval()


def tiny_vae(sample_size: int = 16, seed: int = 0) -> AutoencoderKL:
    """A two-level AutoencoderKL: 1 x 16 x 16 images <-> 2 x 8 x 8 latents."""
    tc.manual_seed(seed)
    return AutoencoderKL(in_channels=1, out_channels=1, down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
                         latent_channels=2, norm_num_groups=4, sample_size=sample_size).eval()


class Instrumented:
    """Calls a model and counts the calls; ``hook(call_index, output)`` may replace the output."""

    def __init__(self, model: Any, hook: Callable[[int, Any], Any] | None = None) -> None:
        self.__wrapped__ = model
        self.hook = hook
        self.calls = 0
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            index = self.calls
            self.calls += 1
        self.threads.add(threading.current_thread().name)
        out = self.__wrapped__(*args, **kwargs)
        return out if self.hook is None else self.hook(index, out)


def same(a: Any, b: Any) -> bool:
    """Bit-identical tensors/arrays."""
    a = a.numpy() if hasattr(a, "numpy") else np.asarray(a)
    b = b.numpy() if hasattr(b, "numpy") else np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
