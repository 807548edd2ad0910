"""ResnetBlock2D: the residual block of diffusers' UNets and VAEs, with the same parameter names.

    h = conv1(act(norm1(x)))            (resampled between act and conv1 when up/down)
    h = h + time_emb_proj(act(temb))    ("default")  or  norm2(h) * (1 + scale) + shift ("scale_shift")
    h = conv2(dropout(act(norm2(h))))
    out = (shortcut(x) + h) / output_scale_factor
"""

from __future__ import annotations

import tensorcore.functional as F
from layers import Conv2d, Dropout, GroupNorm, Linear, Module
from tensorcore import Tensor

from .activations import activation, check_activation, group_norm_act

TIME_EMBEDDING_NORMS = ("default", "scale_shift")


class ResnetBlock2D(Module):
    """Two 3x3 convs with GroupNorm + activation before each, a timestep projection and a skip.

    ``temb_channels=None`` drops the timestep projection (the VAE's blocks); ``up`` /
    ``down`` resample by 2 (nearest / average pool) inside the block, as diffusers'
    ``upsample_type="resnet"`` / ``downsample_type="resnet"`` do.
    """

    def __init__(self, in_channels: int, out_channels: int | None = None, temb_channels: int | None = 512,
                 groups: int = 32, groups_out: int | None = None, eps: float = 1e-6, act_fn: str = "silu",
                 time_embedding_norm: str = "default", dropout: float = 0.0, output_scale_factor: float = 1.0,
                 up: bool = False, down: bool = False) -> None:
        super().__init__()
        if time_embedding_norm not in TIME_EMBEDDING_NORMS:
            raise ValueError(f"ResnetBlock2D: time_embedding_norm must be one of {TIME_EMBEDDING_NORMS}, got {time_embedding_norm!r}")
        if up and down:
            raise ValueError("ResnetBlock2D: up and down exclude each other")
        out_channels = out_channels or in_channels
        self.in_channels, self.out_channels = in_channels, out_channels
        self.act_fn = check_activation(act_fn, "ResnetBlock2D")
        self.time_embedding_norm, self.output_scale_factor = time_embedding_norm, output_scale_factor
        self.up, self.down = up, down
        self.norm1 = GroupNorm(groups, in_channels, eps=eps)
        self.conv1 = Conv2d(in_channels, out_channels, 3, padding=1)
        if temb_channels is None:
            self.time_emb_proj = None
        else:
            scale_shift = time_embedding_norm == "scale_shift"
            self.time_emb_proj = Linear(temb_channels, 2 * out_channels if scale_shift else out_channels)
        self.norm2 = GroupNorm(groups_out or groups, out_channels, eps=eps)
        self.dropout = Dropout(dropout)
        self.conv2 = Conv2d(out_channels, out_channels, 3, padding=1)
        self.conv_shortcut = Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def _resample(self, x: Tensor) -> Tensor:
        if self.up:
            return F.interpolate(x, scale_factor=2, mode="nearest")
        if self.down:
            return F.avg_pool2d(x, 2, 2)
        return x

    def forward(self, x: Tensor, temb: Tensor | None = None) -> Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"ResnetBlock2D: expected input [N, {self.in_channels}, H, W], got {x.shape}")
        act = activation(self.act_fn)
        h = self._resample(group_norm_act(self.norm1, x, self.act_fn))
        x = self._resample(x)
        h = self.conv1(h)
        emb = None
        if self.time_emb_proj is not None and temb is not None:
            emb = self.time_emb_proj(act(temb)).reshape(temb.shape[0], -1, 1, 1)
        if self.time_embedding_norm == "scale_shift":
            if emb is None:
                raise ValueError("ResnetBlock2D: time_embedding_norm='scale_shift' needs a timestep embedding")
            scale, shift = emb.chunk(2, axis=1)
            h = act(self.norm2(h) * (scale + 1.0) + shift)
        else:
            h = group_norm_act(self.norm2, h if emb is None else h + emb, self.act_fn)
        h = self.conv2(self.dropout(h))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        out = x + h
        return out if self.output_scale_factor == 1.0 else out / self.output_scale_factor
