"""The forward of a convolution with few output channels (cuda/conv_halo.cu): the host side.

A convolution to at most 8 channels (an image model's last layer: the SD VAE's 128 -> 3
at 512², a UNet's 320 -> 4) is a GEMM with a narrow N, where the implicit-GEMM tiles
would copy the input once per tap.  This kernel copies each block's halo of input pixels
once per 128-byte channel block and reads the taps from it, so the input is read about
once.  It takes the operands conv_igemm packs (channels-last, padded) and the same
epilogue.  Stride 1, dilation 1; fp16 / bf16, and TF32 (float32 at "high"); the halo
and weight rows of two stages must fit ``SMEM_LIMIT``.  Importable without CuPy (the
CPU CI compiles its instances).
"""

from __future__ import annotations

from typing import Any

from . import loader

SOURCE = "conv_halo.cu"
TILE_H, TILE_W = 4, 32  # output pixels per block: 8 warps of 16
MAX_OUTPUTS = 8  # output channels: one n8 MMA tile (HALO_OUTPUTS)
_ROW_BYTES = 144  # HALO_ROW: a 128-byte channel block and 16 bytes of padding
SMEM_LIMIT = 113 * 1024  # two blocks per SM (228 KiB, 1 KiB reserved per block)
_DTYPES = ("float32", "float16", "bfloat16")
# cuda/conv_halo.cu's HaloShape, passed by value: int32 extents
_SHAPE = [("extents", "int32", (10,))]


def smem_bytes(kernel_hw: tuple[int, int]) -> int:
    """Two stages of the halo and the weight rows for a kernel of kernel_hw taps."""
    r, s = kernel_hw
    return 2 * ((TILE_H + r - 1) * (TILE_W + s - 1) + MAX_OUTPUTS * r * s) * _ROW_BYTES


def covers(cout: int, kernel_hw: tuple[int, int], stride: tuple[int, int],
           dilation: tuple[int, int], dtype_name: str, three_pass: bool) -> bool:
    """Whether the kernel runs this forward: few outputs, stride and dilation 1, a 16-bit
    or TF32 (not 3xTF32: ``three_pass``) product, shared memory within the limit."""
    return (cout <= MAX_OUTPUTS and stride == (1, 1) and dilation == (1, 1)
            and dtype_name in _DTYPES and not three_pass and smem_bytes(kernel_hw) <= SMEM_LIMIT)


def _expression(ctype: str) -> str:
    return f"conv_halo_kernel<{ctype}, {TILE_H}, {TILE_W}>"


def instances() -> list[str]:
    """Every kernel instantiation the host code may launch."""
    return [_expression(loader.C_TYPES[name]) for name in _DTYPES]


def launch(act: Any, wpk: Any, out: Any, padding: tuple[int, int], bias: Any, act_code: int,
           residual: Any, scale: float) -> None:
    """out [N][Nout][OH][OW] = epilogue(conv(act, wpk)): act the packed input
    [N][IH][IW][Cp], wpk the packed weight [Nout][R][S][Cp] (dense rows), bias and
    residual dense or None."""
    import numpy

    from .. import report
    from .util import NULL

    n, ih, iw, cp = act.shape
    nout, r, s = wpk.shape[:3]
    oh, ow = out.shape[2:]
    smem = smem_bytes((r, s))
    expression = _expression(loader.ctype_of(out.dtype))
    if report.active:
        report.note_kernel(expression)
    shape = numpy.array((ih, iw, cp, nout, oh, ow, r, s, *padding), numpy.int32).view(_SHAPE)
    grid = (-(-ow // TILE_W), -(-oh // TILE_H), n)
    loader.sized_instance(SOURCE, expression, smem)(
        grid, (TILE_H * TILE_W // 16 * 32,),
        (act, wpk, out, NULL if bias is None else bias, NULL if residual is None else residual,
         shape, numpy.int32(act_code), numpy.float32(scale)), shared_mem=smem)
