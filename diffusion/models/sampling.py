"""Resolution changes between UNet levels: Downsample2D (stride-2 conv) and Upsample2D (nearest x2 + conv)."""

from __future__ import annotations

import tensorcore as tc
import tensorcore.functional as F
from layers import Conv2d, Module
from tensorcore import Tensor


def _check_channels(owner: str, x: Tensor, channels: int) -> None:
    if x.ndim != 4 or x.shape[1] != channels:
        raise ValueError(f"{owner}: expected input [N, {channels}, H, W], got {x.shape}")


class Downsample2D(Module):
    """Halves H and W with a 3x3 stride-2 conv (``conv``), or a 2x2 average pool when ``use_conv`` is off.

    ``padding=0`` pads one zero row and column at the bottom and right first (the VAE
    encoder's layout), so odd and even sizes both halve like the original networks.
    """

    def __init__(self, channels: int, use_conv: bool = True, out_channels: int | None = None, padding: int = 1) -> None:
        super().__init__()
        self.channels, self.out_channels = channels, out_channels or channels
        self.use_conv, self.padding = use_conv, padding
        if use_conv:
            self.conv = Conv2d(channels, self.out_channels, 3, stride=2, padding=padding)
        elif self.out_channels != channels:
            raise ValueError(f"Downsample2D: pooling keeps the channels, got {channels} -> {self.out_channels}")

    def forward(self, x: Tensor) -> Tensor:
        _check_channels("Downsample2D", x, self.channels)
        if not self.use_conv:
            return F.avg_pool2d(x, 2, 2)
        if self.padding == 0:
            x = tc.pad(x, (0, 1, 0, 1))
        return self.conv(x)


class Upsample2D(Module):
    """Doubles H and W by nearest-neighbour repetition (or resizes to ``output_size``), then a 3x3
    conv (``conv``) when ``use_conv``."""

    def __init__(self, channels: int, use_conv: bool = True, out_channels: int | None = None) -> None:
        super().__init__()
        self.channels, self.out_channels, self.use_conv = channels, out_channels or channels, use_conv
        if not use_conv and self.out_channels != channels:
            raise ValueError(f"Upsample2D: without a conv the channels stay, got {channels} -> {self.out_channels}")
        self.conv = Conv2d(channels, self.out_channels, 3, padding=1) if use_conv else None

    def forward(self, x: Tensor, output_size: tuple[int, int] | None = None) -> Tensor:
        _check_channels("Upsample2D", x, self.channels)
        if output_size is None:
            x = F.interpolate(x, scale_factor=2, mode="nearest")
        else:
            x = F.interpolate(x, size=output_size, mode="nearest")
        return x if self.conv is None else self.conv(x)
