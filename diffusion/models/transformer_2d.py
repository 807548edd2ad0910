"""The transformer over a feature map's pixels in Stable Diffusion's UNets (diffusers' ``Transformer2DModel``).

    h = proj_in(norm(x))                       (a 1x1 conv, or a linear over tokens)
    h = block(h, context)  for each of transformer_blocks
    out = x + proj_out(h)

each ``BasicTransformerBlock`` being

    h = h + attn1(norm1(h))                    (self-attention; on the context when only_cross_attention)
    h = h + attn2(norm2(h), context)           (cross-attention)
    h = h + ff(norm3(h))                       (GEGLU feed-forward)
"""

from __future__ import annotations

from layers import Conv2d, Dropout, GroupNorm, LayerNorm, Linear, Module, ModuleList
from tensorcore import Tensor

from .activations import GEGLU
from .attention import Attention


class FeedForward(Module):
    """``net.2(net.1(net.0(x)))``: GEGLU to ``mult * dim`` channels, dropout, back to ``dim``."""

    def __init__(self, dim: int, mult: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        inner = dim * mult
        self.net = ModuleList([GEGLU(dim, inner), Dropout(dropout), Linear(inner, dim)])

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.net:
            x = layer(x)
        return x


class BasicTransformerBlock(Module):
    """Self-attention, cross-attention on ``context`` and a feed-forward, each after a LayerNorm, with residuals."""

    def __init__(self, dim: int, num_attention_heads: int, attention_head_dim: int, cross_attention_dim: int,
                 dropout: float = 0.0, attention_bias: bool = False, only_cross_attention: bool = False,
                 upcast_attention: bool = False, norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.only_cross_attention = only_cross_attention
        heads = dict(heads=num_attention_heads, dim_head=attention_head_dim, dropout=dropout, bias=attention_bias,
                     upcast_attention=upcast_attention, residual_connection=False)
        self.norm1 = LayerNorm(dim, eps=norm_eps)
        self.attn1 = Attention(dim, cross_attention_dim=cross_attention_dim if only_cross_attention else None, **heads)
        self.norm2 = LayerNorm(dim, eps=norm_eps)
        self.attn2 = Attention(dim, cross_attention_dim=cross_attention_dim, **heads)
        self.norm3 = LayerNorm(dim, eps=norm_eps)
        self.ff = FeedForward(dim, dropout=dropout)

    def forward(self, h: Tensor, context: Tensor) -> Tensor:
        h = h + self.attn1(self.norm1(h), context if self.only_cross_attention else None)
        h = h + self.attn2(self.norm2(h), context)
        return h + self.ff(self.norm3(h))


class Transformer2DModel(Module):
    """GroupNorm, ``proj_in``, ``num_layers`` BasicTransformerBlocks over the H·W tokens, ``proj_out``, plus the input.

    ``in_channels`` = ``num_attention_heads * attention_head_dim`` in every UNet of the
    SD family; ``use_linear_projection`` makes ``proj_in`` / ``proj_out`` linears (SD-2.x,
    SDXL) instead of 1x1 convs (SD-1.x).
    """

    def __init__(self, num_attention_heads: int, attention_head_dim: int, in_channels: int, cross_attention_dim: int,
                 num_layers: int = 1, norm_num_groups: int = 32, use_linear_projection: bool = False,
                 only_cross_attention: bool = False, upcast_attention: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        inner = num_attention_heads * attention_head_dim
        self.in_channels, self.use_linear_projection = in_channels, use_linear_projection
        self.norm = GroupNorm(norm_num_groups, in_channels, eps=1e-6)
        self.proj_in = Linear(in_channels, inner) if use_linear_projection else Conv2d(in_channels, inner, 1)
        self.transformer_blocks = ModuleList([
            BasicTransformerBlock(inner, num_attention_heads, attention_head_dim, cross_attention_dim, dropout=dropout,
                                  only_cross_attention=only_cross_attention, upcast_attention=upcast_attention)
            for _ in range(num_layers)])
        self.proj_out = Linear(inner, in_channels) if use_linear_projection else Conv2d(inner, in_channels, 1)

    def forward(self, x: Tensor, context: Tensor) -> Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"Transformer2DModel: expected input [B, {self.in_channels}, H, W], got {x.shape}")
        b, _, height, width = x.shape
        h = self.norm(x)
        if not self.use_linear_projection:
            h = self.proj_in(h)
        h = h.reshape(b, h.shape[1], height * width).transpose(1, 2)
        if self.use_linear_projection:
            h = self.proj_in(h)
        for block in self.transformer_blocks:
            h = block(h, context)
        if self.use_linear_projection:
            h = self.proj_out(h)
        h = h.transpose(1, 2).reshape(b, h.shape[2], height, width)
        if not self.use_linear_projection:
            h = self.proj_out(h)
        return h + x
