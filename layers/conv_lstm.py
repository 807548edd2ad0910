"""ConvLSTM2d: an LSTM whose gates are convolutions, for sequences of images."""

from __future__ import annotations

from typing import Any

import tensorcore as tc
import tensorcore.functional as F
from tensorcore import Tensor

from .conv import Conv2d
from .module import Module


class ConvLSTM2d(Module):
    """Input ``[B, T, C, H, W]`` -> ``(outputs [B, T, Hc, H, W], (h, c))`` with h, c ``[B, Hc, H, W]``.

    One convolution over ``concat(x_t, h)`` (weight ``[4Hc, C+Hc, k, k]``, "same" padding,
    odd kernel) gives the gates in the order i, f, o, g:
    ``i, f, o = σ(·)``, ``g = tanh(·)``, ``c' = f⊙c + i⊙g``, ``h' = o⊙tanh(c')``.
    Gradients flow through every step (full backpropagation through time).
    """

    def __init__(self, in_channels: int, hidden_channels: int, kernel_size: int = 3, bias: bool = True,
                 dtype: Any = tc.float32, device: str | None = None) -> None:
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"ConvLSTM2d: kernel_size must be a positive odd int for 'same' padding, got {kernel_size}")
        self.in_channels, self.hidden_channels, self.kernel_size = in_channels, hidden_channels, kernel_size
        self.conv = Conv2d(in_channels + hidden_channels, 4 * hidden_channels, kernel_size,
                           padding=kernel_size // 2, bias=bias, dtype=dtype, device=device)

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor] | None = None
                ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        if x.ndim != 5 or x.shape[2] != self.in_channels:
            raise ValueError(f"ConvLSTM2d: expected input [B, T, {self.in_channels}, H, W], got {x.shape}")
        batch, steps, _, height, width = x.shape
        hidden_shape = (batch, self.hidden_channels, height, width)
        if state is None:
            h = tc.zeros(*hidden_shape, dtype=x.dtype, device=x.device)
            c = h
        else:
            h, c = state
            if h.shape != hidden_shape or c.shape != hidden_shape:
                raise ValueError(f"ConvLSTM2d: state must be two tensors of shape {hidden_shape}, got {h.shape}, {c.shape}")
        outputs = []
        for t in range(steps):
            gates = self.conv(tc.cat([x[:, t], h], axis=1))
            i, f, o, g = gates.chunk(4, axis=1)
            c = F.sigmoid(f) * c + F.sigmoid(i) * F.tanh(g)
            h = F.sigmoid(o) * F.tanh(c)
            outputs.append(h)
        return tc.stack(outputs, 1), (h, c)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.hidden_channels}, kernel_size={self.kernel_size}"
