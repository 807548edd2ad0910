"""Flash attention on the tensor cores (``cuda/flash_attention.cu``): the output of
softmax(q kᵀ · scale) v for float16 / bfloat16 inputs, without the score matrix.

``fits`` says whether a call can take it: 16-bit q, k, v of one dtype, [B, H, L, d] with
d a multiple of 8 whose 16-rounded width is one of ``HEAD_WIDTHS`` (head dims 40, 64,
80, 128, 160 and their neighbours), v as wide as q, the head dim contiguous and every
other stride a multiple of 8 elements on 16-byte aligned data -- so the kernel reads the
heads straight out of a projection's [B, L, H·d] output.  ``causal`` is fine, and so is
an additive mask of q's dtype that ``mask_fits`` (a [B, H, Lq, Lk] view, keys contiguous:
the text encoder's causal-and-padding mask, or a padding mask broadcast from
[B, 1, 1, Lk]).  ``instances`` lists every instantiation, for the loader's PTX test.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import loader
from .. import report

SOURCE = "flash_attention.cu"
HEAD_WIDTHS = (48, 64, 80, 128, 160)  # D: the head dim rounded up to 16
KEYS, THREADS = 64, 128  # keys per tile (FA_KEYS: the backward's, the forward's for wide heads), threads per block
SHORT_KEYS = 96  # the forward's key tile for short key sequences (whole k8 steps of four 8-key tiles)
CTYPES = {"float16": "half_t", "bfloat16": "bf16_t"}


def instances() -> list[str]:
    """Every kernel instantiation the host code may launch: per width, the head dims
    it holds (the width, and 8 less: the kernel skips the padding's MMAs), without and
    with an additive mask."""
    return list(dict.fromkeys(
        _expression(ctype, d, row_tiles(width), key_tile(width, lk), masked)
        for ctype in CTYPES.values() for width in HEAD_WIDTHS for d in (width - 8, width)
        for lk in (SHORT_KEYS, None) for masked in (False, True)))


def width(d: int) -> int:
    return -(-d // 16) * 16


def row_tiles(width: int) -> int:
    """16-row tiles per warp: two for narrow heads (each K/V fragment then feeds two MMAs),
    one where the accumulators of two would not fit the registers."""
    return 2 if width <= 64 else 1


def key_tile(width: int, lk: int | None = None) -> int:
    """Keys per tile of the forward for ``lk`` keys (None: any number): 128 up to width 80
    (half the per-tile softmax bookkeeping and barriers; 4096² at d 40 on an H100: 0.258
    against 0.297 ms with 64), or SHORT_KEYS where they hold every key (a text encoder's
    77 then cost 96 keys' work, not 128); 64 above, where 128 keys' scores would spill
    registers."""
    if width > 80:
        return KEYS
    return SHORT_KEYS if lk is not None and lk <= SHORT_KEYS else 128


def _expression(ctype: str, d: int, tiles: int, keys: int, masked: bool) -> str:
    return f"flash_attention_fwd_kernel<{ctype}, {d}, {tiles}, {keys}, {str(masked).lower()}>"


def fits(q: Any, k: Any, v: Any) -> bool:
    """Whether the kernel computes this attention (see the module docstring)."""
    if not (q.ndim == k.ndim == v.ndim == 4 and q.dtype == k.dtype == v.dtype and q.dtype.name in CTYPES):
        return False
    b, h, _, d = q.shape
    if k.shape[:2] != (b, h) or v.shape[:2] != (b, h) or k.shape[3] != d or v.shape[3] != d \
            or k.shape[2] != v.shape[2] or d % 8 or width(d) not in HEAD_WIDTHS:
        return False
    return all(readable(t) for t in (q, k, v))


def mask_fits(mask: Any, q: Any, k: Any) -> bool:
    """Whether the forward adds this mask as it lies: [B, H, Lq, Lk] of q's dtype (any
    strides over the first three axes, zero for broadcast ones), the keys contiguous."""
    shape = (*q.shape[:3], k.shape[2])
    return mask.ndim == 4 and tuple(mask.shape) == shape and mask.dtype == q.dtype \
        and (mask.strides[3] == mask.itemsize or shape[3] == 1) and mask.data.ptr % mask.itemsize == 0


def readable(t: Any) -> bool:
    """Whether the kernels can read [B, H, L, d] ``t`` as it lies: the head dim
    contiguous, every other stride a multiple of 8 elements, the data 16-byte aligned."""
    item = t.dtype.itemsize
    return t.strides[3] == item and not any(s % (8 * item) for s in t.strides[:3]) and t.data.ptr % 16 == 0


def forward(q: Any, k: Any, v: Any, causal: bool, scale: float, with_lse: bool = False,
            mask: Any = None) -> Any:
    """out [B, H, Lq, d] of softmax(q kᵀ · scale + mask) v, key j hidden from query i when
    ``causal`` and j > i; the inputs passed ``fits`` (the mask ``mask_fits``) and
    ``scale`` > 0.  A row that sees no key (every mask value -inf) gets NaN, as the
    reference's softmax gives it.  out is a
    view of a [B, Lq, H, d] array, so ``out.transpose(0, 2, 1, 3).reshape(B, Lq, H * d)``
    is free.  ``with_lse`` returns (out, lse) with lse [B, H, Lq] float32 the rows'
    log-sum-exp of the scaled scores in base 2 (log2 Σ_j 2^(s_ij · scale · log2 e))."""
    import cupy

    if not scale > 0:
        raise ValueError(f"flash attention: scale must be > 0, got {scale}")
    b, h, lq, d = q.shape
    lk = k.shape[2]
    out = cupy.empty((b, lq, h, d), dtype=q.dtype).transpose(0, 2, 1, 3)
    lse = cupy.empty((b, h, lq), dtype=cupy.float32) if with_lse else None
    if out.size == 0 or lk == 0:  # no keys: an empty sum, as probabilities [Lq, 0] times v give
        out.fill(0)
        if lse is not None:
            lse.fill(-math.inf)
        return (out, lse) if with_lse else out
    launch(q, k, v, out, lse, causal, scale, row_tiles(width(d)), mask)
    return (out, lse) if with_lse else out


def launch(q: Any, k: Any, v: Any, out: Any, lse: Any, causal: bool, scale: float, tiles: int,
           mask: Any = None) -> None:
    """One kernel launch with ``tiles`` 16-row tiles per warp (``forward`` picks them)."""
    from .util import ptr

    b, h, lq, d = q.shape
    D = width(d)
    keys = key_tile(D, k.shape[2])
    expression = _expression(CTYPES[q.dtype.name], d, tiles, keys, mask is not None)
    rows = 4 * 16 * tiles
    smem = (rows + 4 * keys) * (D + 8) * 2  # Q, and two stages each of K and V
    if report.active:
        report.note_kernel(expression)
    item = q.dtype.itemsize
    strides = [s // item for t in (q, k, v) for s in t.strides[:3]]
    mask_strides = (0, 0, 0) if mask is None else tuple(s // item for s in mask.strides[:3])
    loader.sized_instance(SOURCE, expression, smem)(
        (-(-lq // rows), b * h), (THREADS,),
        (q, k, v, out, ptr(lse), np.int32(h), np.int32(lq), np.int32(k.shape[2]), np.int32(d),
         np.float32(scale * math.log2(math.e)), np.int32(bool(causal)), *(np.int64(s) for s in strides),
         ptr(mask), *(np.int64(s) for s in mask_strides), np.float32(1 / scale)),
        shared_mem=smem)

