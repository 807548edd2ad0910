"""Timestep embeddings: sinusoidal (``Timesteps``), Gaussian Fourier features, and the MLP after them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import tensorcore as tc
from layers import Linear, Module
from tensorcore import Tensor

from .activations import activation, check_activation


def timestep_frequencies(half_dim: int, downscale_freq_shift: float, max_period: float = 10000.0) -> np.ndarray:
    """``exp(-ln(max_period) * i / (half_dim - shift))`` for i < half_dim, computed in float32 as diffusers does."""
    if half_dim - downscale_freq_shift == 0:
        raise ValueError(f"timestep embedding: half_dim={half_dim} equals freq_shift={downscale_freq_shift}")
    exponent = np.arange(half_dim, dtype=np.float32) * np.float32(-math.log(max_period))
    return np.exp(exponent / np.float32(half_dim - downscale_freq_shift))


def sinusoidal_embedding(timesteps: Tensor, frequencies: Tensor, flip_sin_to_cos: bool, scale: float = 1.0) -> Tensor:
    """``[sin(t f s) | cos(t f s)]`` (or cos first) for timesteps [B] -> [B, 2 * len(f)]."""
    args = timesteps.reshape(-1, 1) * frequencies.reshape(1, -1)
    if scale != 1.0:
        args = args * scale
    parts = [tc.cos(args), tc.sin(args)] if flip_sin_to_cos else [tc.sin(args), tc.cos(args)]
    return tc.cat(parts, axis=-1)


def get_guidance_scale_embedding(w: Tensor, embedding_dim: int = 512, dtype: Any = tc.float32) -> Tensor:
    """Guidance scales [B] -> [B, embedding_dim]: ``[sin(1000 w f) | cos(1000 w f)]`` (zero-padded
    when odd), the ``timestep_cond`` of a guidance-distilled UNet (``time_cond_proj_dim``, LCM);
    diffusers' ``get_guidance_scale_embedding``.  LCM pipelines pass ``guidance_scale - 1``."""
    if not isinstance(w, Tensor) or w.ndim != 1:
        raise ValueError(f"get_guidance_scale_embedding: w must be a 1-D tensor of guidance scales, "
                         f"got {w.shape if isinstance(w, Tensor) else type(w).__name__}")
    if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim < 4:
        raise ValueError(f"get_guidance_scale_embedding: embedding_dim must be an int >= 4, got {embedding_dim!r}")
    # frequencies exp(-i ln(10000) / (half_dim - 1)), correctly rounded to float32; torch's float32
    # exp can be an ulp off, which moves sin(1000 w f) by up to 1000 w ulp(f) (a few 1e-4 at w = 7)
    half_dim = embedding_dim // 2
    step = np.float32(math.log(10000.0)) / np.float32(half_dim - 1)
    frequencies = np.exp(np.arange(half_dim, dtype=np.float32).astype(np.float64) * -float(step)).astype(np.float32)
    frequencies = tc.tensor(frequencies, device=w.device).to(dtype)
    emb = sinusoidal_embedding((w * 1000.0).to(dtype), frequencies, flip_sin_to_cos=False)
    return tc.pad(emb, (0, 1)) if embedding_dim % 2 else emb


class Timesteps(Module):
    """Sinusoidal embedding of timesteps [B] -> float32 [B, num_channels] (diffusers' ``Timesteps``).

    The embedding is computed in float32 whatever the model's dtype, as diffusers does;
    the frequency table is made once per device.
    """

    def __init__(self, num_channels: int, flip_sin_to_cos: bool, downscale_freq_shift: float, scale: float = 1.0) -> None:
        super().__init__()
        self.num_channels, self.flip_sin_to_cos = num_channels, flip_sin_to_cos
        self.downscale_freq_shift, self.scale = downscale_freq_shift, scale
        self._frequencies = timestep_frequencies(num_channels // 2, downscale_freq_shift)
        self._on_device: dict[str, Tensor] = {}

    def forward(self, timesteps: Tensor) -> Tensor:
        if timesteps.device not in self._on_device:
            self._on_device[timesteps.device] = tc.tensor(self._frequencies, device=timesteps.device)
        frequencies = self._on_device[timesteps.device]
        emb = sinusoidal_embedding(timesteps.to(dtype=tc.float32), frequencies, self.flip_sin_to_cos, self.scale)
        if self.num_channels % 2:
            emb = tc.pad(emb, (0, 1))
        return emb

    def extra_repr(self) -> str:
        return f"num_channels={self.num_channels}, flip_sin_to_cos={self.flip_sin_to_cos}, freq_shift={self.downscale_freq_shift}"


class GaussianFourierProjection(Module):
    """Random Fourier features of log noise levels: ``[sin(2π w log t) | cos(...)]`` (diffusers' layout).

    ``weight`` is a fixed (untrained) buffer drawn N(0, scale²), saved under diffusers' key.
    """

    def __init__(self, embedding_size: int = 256, scale: float = 1.0, log: bool = True, flip_sin_to_cos: bool = False) -> None:
        super().__init__()
        self.register_buffer("weight", tc.randn(embedding_size) * scale)
        self.log, self.flip_sin_to_cos = log, flip_sin_to_cos

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(dtype=self.weight.dtype)
        return sinusoidal_embedding(tc.log(x) if self.log else x, self.weight, self.flip_sin_to_cos, 2 * math.pi)


class TimestepEmbedding(Module):
    """``post_act(linear_2(act(linear_1(x + cond_proj(condition)))))``: the MLP turning a timestep
    embedding into the model's ``temb``.

    ``cond_proj_dim`` adds ``cond_proj`` (no bias), through which a guidance embedding joins
    the input (diffusers' ``time_cond_proj_dim``, LCM's ``timestep_cond``); ``post_act_fn``
    names an activation applied last.
    """

    def __init__(self, in_channels: int, time_embed_dim: int, act_fn: str = "silu", out_dim: int | None = None,
                 post_act_fn: str | None = None, cond_proj_dim: int | None = None) -> None:
        super().__init__()
        self.act_fn = check_activation(act_fn, "TimestepEmbedding")
        self.post_act_fn = None if post_act_fn is None else check_activation(post_act_fn, "TimestepEmbedding")
        self.linear_1 = Linear(in_channels, time_embed_dim)
        self.cond_proj = None if cond_proj_dim is None else Linear(cond_proj_dim, in_channels, bias=False)
        self.linear_2 = Linear(time_embed_dim, out_dim or time_embed_dim)

    def forward(self, sample: Tensor, condition: Tensor | None = None) -> Tensor:
        if condition is not None:
            if self.cond_proj is None:
                raise ValueError("TimestepEmbedding: a condition was given, but there is no cond_proj (cond_proj_dim)")
            sample = sample + self.cond_proj(condition)
        out = self.linear_2(activation(self.act_fn)(self.linear_1(sample)))
        return out if self.post_act_fn is None else activation(self.post_act_fn)(out)
