"""AutoencoderKL: the latent-diffusion VAE, configured and named as diffusers' ``AutoencoderKL``.

``encode(x)`` returns the posterior (a DiagonalGaussianDistribution), ``decode(z)`` the
image.  ``enable_tiling()`` runs both over overlapping tiles with blended seams (memory
bounded by one row of tiles); ``enable_slicing()`` runs a batch one sample at a time.
Each switch bumps the module's ``structure_version``, so compiled plans retrace:
``decode_compiled`` / ``encode_compiled`` (``compiled("decode")``) replay ``tc.compile``
plans and pick the switches up by retracing.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorcore as tc
from layers import Conv2d
from tensorcore import Generator, Tensor

from .activations import check_activation
from .bounds import MAX_WIDTH, conv_net_shares, count, flag, list_of, name, number, optional, size_or_pair, width
from .config import register_to_config
from .distributions import DiagonalGaussianDistribution
from .pretrained import PretrainedModel
from .tiling import tiled_apply
from .vae import Decoder, Encoder


class AutoencoderKL(PretrainedModel):
    """Image [B, in_channels, H, W] <-> latent [B, latent_channels, H/f, W/f], f = 2^(levels - 1).

    ``scaling_factor`` / ``shift_factor`` are stored for pipelines (latents are
    ``(z - shift) * scale``); the model itself never applies them, as in diffusers.
    """

    diffusers_class = "AutoencoderKL"

    config_bounds = {
        "in_channels": width(), "out_channels": width(), "down_block_types": list_of(name()),
        "up_block_types": list_of(name()), "block_out_channels": list_of(width()), "layers_per_block": count(),
        "act_fn": name(), "latent_channels": width(), "norm_num_groups": width(), "sample_size": size_or_pair(),
        "scaling_factor": number(), "shift_factor": optional(number()),
        "latents_mean": optional(list_of(number(), high=MAX_WIDTH)), "latents_std": optional(list_of(number(), high=MAX_WIDTH)),
        "force_upcast": flag(), "use_quant_conv": flag(), "use_post_quant_conv": flag(), "mid_block_add_attention": flag(),
    }
    parameter_shares = staticmethod(conv_net_shares)

    @register_to_config
    def __init__(self, in_channels: int = 3, out_channels: int = 3,
                 down_block_types: Sequence[str] = ("DownEncoderBlock2D",),
                 up_block_types: Sequence[str] = ("UpDecoderBlock2D",), block_out_channels: Sequence[int] = (64,),
                 layers_per_block: int = 1, act_fn: str = "silu", latent_channels: int = 4, norm_num_groups: int = 32,
                 sample_size: int | Sequence[int] = 32, scaling_factor: float = 0.18215, shift_factor: float | None = None,
                 latents_mean: Sequence[float] | None = None, latents_std: Sequence[float] | None = None,
                 force_upcast: bool = True, use_quant_conv: bool = True, use_post_quant_conv: bool = True,
                 mid_block_add_attention: bool = True) -> None:
        super().__init__()
        if not block_out_channels or len(down_block_types) != len(block_out_channels) \
                or len(up_block_types) != len(block_out_channels):
            raise ValueError(f"AutoencoderKL: block_out_channels ({len(block_out_channels)}), down_block_types "
                             f"({len(down_block_types)}) and up_block_types ({len(up_block_types)}) must have the same positive length")
        if not scaling_factor:  # pipelines divide the latents by it: refuse before sampling, not after
            raise ValueError(f"AutoencoderKL: scaling_factor must be a non-zero number, got {scaling_factor!r}")
        act_fn = check_activation(act_fn, "AutoencoderKL")
        self.encoder = Encoder(in_channels, latent_channels, down_block_types, block_out_channels, layers_per_block,
                               norm_num_groups, act_fn, double_z=True, mid_block_add_attention=mid_block_add_attention)
        self.decoder = Decoder(latent_channels, out_channels, up_block_types, block_out_channels, layers_per_block,
                               norm_num_groups, act_fn, mid_block_add_attention=mid_block_add_attention)
        self.quant_conv = Conv2d(2 * latent_channels, 2 * latent_channels, 1) if use_quant_conv else None
        self.post_quant_conv = Conv2d(latent_channels, latent_channels, 1) if use_post_quant_conv else None
        self.downscale = 2 ** (len(block_out_channels) - 1)
        size = sample_size[0] if isinstance(sample_size, Sequence) else sample_size
        self._use_tiling, self._use_slicing = False, False
        self._tile_sample_min_size, self._tile_overlap_factor = int(size), 0.25

    # ----- switches ------------------------------------------------------------------------
    @property
    def use_tiling(self) -> bool:
        return self._use_tiling

    @property
    def use_slicing(self) -> bool:
        return self._use_slicing

    @property
    def tile_sample_min_size(self) -> int:
        """Tile side in image pixels."""
        return self._tile_sample_min_size

    @property
    def tile_latent_min_size(self) -> int:
        """Tile side in latent pixels."""
        return self._tile_sample_min_size // self.downscale

    @property
    def tile_overlap_factor(self) -> float:
        return self._tile_overlap_factor

    def enable_tiling(self, tile_sample_min_size: int | None = None, tile_overlap_factor: float = 0.25) -> None:
        """Encode and decode images larger than a tile as overlapping tiles with blended seams.

        ``tile_sample_min_size`` (image pixels, default the config's ``sample_size``) must be a
        multiple of the latent downscale factor; ``tile_overlap_factor`` is in [0, 1).
        """
        size = self.config.sample_size if tile_sample_min_size is None else tile_sample_min_size
        size = size[0] if isinstance(size, Sequence) else size
        if not isinstance(size, int) or size < self.downscale or size % self.downscale:
            raise ValueError(f"enable_tiling: tile_sample_min_size must be a positive multiple of {self.downscale}, got {size!r}")
        if not 0.0 <= tile_overlap_factor < 1.0:
            raise ValueError(f"enable_tiling: tile_overlap_factor must be in [0, 1), got {tile_overlap_factor!r}")
        self._switch(True, self._use_slicing, size, float(tile_overlap_factor))

    def disable_tiling(self) -> None:
        self._switch(False, self._use_slicing, self._tile_sample_min_size, self._tile_overlap_factor)

    def enable_slicing(self) -> None:
        """Encode and decode a batch one sample at a time (same results, less memory)."""
        self._switch(self._use_tiling, True, self._tile_sample_min_size, self._tile_overlap_factor)

    def disable_slicing(self) -> None:
        self._switch(self._use_tiling, False, self._tile_sample_min_size, self._tile_overlap_factor)

    def extra_repr(self) -> str:
        """The switches (also part of a compiled plan's identity on disk, as they change the program)."""
        return (f"use_tiling={self._use_tiling}, use_slicing={self._use_slicing}, tile_sample_min_size="
                f"{self._tile_sample_min_size}, tile_overlap_factor={self._tile_overlap_factor}")

    def _switch(self, tiling: bool, slicing: bool, size: int, overlap: float) -> None:
        state = (tiling, slicing, size, overlap)
        if state != (self._use_tiling, self._use_slicing, self._tile_sample_min_size, self._tile_overlap_factor):
            self._use_tiling, self._use_slicing, self._tile_sample_min_size, self._tile_overlap_factor = state
            self._structure_changed()

    # ----- encode / decode -----------------------------------------------------------------
    def encode(self, x: Tensor) -> DiagonalGaussianDistribution:
        """The posterior over latents of images ``x`` [B, in_channels, H, W]."""
        self._check("encode", x, self.config.in_channels)
        return DiagonalGaussianDistribution(self._moments(x))

    def decode(self, z: Tensor) -> Tensor:
        """Images from latents ``z`` [B, latent_channels, h, w] (unscaled: divide by scaling_factor first)."""
        self._check("decode", z, self.config.latent_channels)
        return self._images(z)

    def encode_compiled(self, x: Tensor) -> DiagonalGaussianDistribution:
        """``encode`` through a ``tc.compile`` plan (see ``compiled``)."""
        self._check("encode_compiled", x, self.config.in_channels)
        return DiagonalGaussianDistribution(self.compiled("encode")(x))

    def decode_compiled(self, z: Tensor) -> Tensor:
        """``decode`` through a ``tc.compile`` plan (see ``compiled``)."""
        self._check("decode_compiled", z, self.config.latent_channels)
        return self.compiled("decode")(z)

    def compiled(self, part: str) -> Any:
        """This VAE's compiled ``"encode"`` (image -> posterior moments) or ``"decode"``
        (latents -> images) callable, made on first use: a plan per input shape, retraced
        when the structure version changes -- which the tiling and slicing switches bump."""
        if part not in ("encode", "decode"):
            raise ValueError(f"AutoencoderKL.compiled: part must be 'encode' or 'decode', got {part!r}")
        return self._compiled(part, self._moments if part == "encode" else self._images)

    def forward(self, sample: Tensor, sample_posterior: bool = False, generator: Generator | None = None) -> Tensor:
        """Reconstruction: decode the posterior's mode (or a sample of it when ``sample_posterior``)."""
        posterior = self.encode(sample)
        return self.decode(posterior.sample(generator) if sample_posterior else posterior.mode())

    def tiled_encode(self, x: Tensor) -> DiagonalGaussianDistribution:
        """``encode`` through tiles, whatever the image size and the tiling switch."""
        self._check("tiled_encode", x, self.config.in_channels)
        return DiagonalGaussianDistribution(tiled_apply(x, self._encode_tile, self.tile_sample_min_size,
                                                        self.tile_latent_min_size, self.tile_overlap_factor))

    def tiled_decode(self, z: Tensor) -> Tensor:
        """``decode`` through tiles, whatever the latent size and the tiling switch."""
        self._check("tiled_decode", z, self.config.latent_channels)
        return tiled_apply(z, self._decode_tile, self.tile_latent_min_size, self.tile_sample_min_size,
                           self.tile_overlap_factor)

    def _moments(self, x: Tensor) -> Tensor:
        return self._sliced(self._encode, x)

    def _images(self, z: Tensor) -> Tensor:
        return self._sliced(self._decode, z)

    def _sliced(self, fn: Any, x: Tensor) -> Tensor:
        if self._use_slicing and x.shape[0] > 1:
            return tc.cat([fn(x[i:i + 1]) for i in range(x.shape[0])], axis=0)
        return fn(x)

    def _encode(self, x: Tensor) -> Tensor:
        if self._use_tiling and max(x.shape[2:]) > self.tile_sample_min_size:
            return tiled_apply(x, self._encode_tile, self.tile_sample_min_size, self.tile_latent_min_size,
                               self.tile_overlap_factor)
        return self._encode_tile(x)

    def _decode(self, z: Tensor) -> Tensor:
        if self._use_tiling and max(z.shape[2:]) > self.tile_latent_min_size:
            return tiled_apply(z, self._decode_tile, self.tile_latent_min_size, self.tile_sample_min_size,
                               self.tile_overlap_factor)
        return self._decode_tile(z)

    def _encode_tile(self, x: Tensor) -> Tensor:
        moments = self.encoder(x)
        return moments if self.quant_conv is None else self.quant_conv(moments)

    def _decode_tile(self, z: Tensor) -> Tensor:
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        return self.decoder(z)

    def _check(self, op: str, x: Tensor, channels: int) -> None:
        if not isinstance(x, Tensor) or x.ndim != 4 or x.shape[1] != channels:
            got = x.shape if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"AutoencoderKL.{op}: expected [B, {channels}, H, W], got {got}")
