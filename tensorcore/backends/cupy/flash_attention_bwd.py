"""Flash attention backward on the tensor cores (``cuda/flash_attention_bwd.cu``): dq, dk,
dv of ``flash_attention.forward`` from its output and log-sum-exp, the probabilities
recomputed tile by tile instead of read from memory.

Takes what the forward took (``flash_attention.fits``); the output gradient may have any
layout (it is copied to a dense one unless the kernel can read it as it lies).  dq, dk
and dv come back dense, [B, H, L, d].  ``instances`` lists every instantiation, for the
loader's PTX test.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import loader
from .. import report
from .flash_attention import CTYPES, HEAD_WIDTHS, KEYS, THREADS, readable, width

SOURCE = "flash_attention_bwd.cu"
QUERY_ROWS = 64  # queries per tile (as in the kernel)


def instances() -> list[str]:
    """Every kernel instantiation the host code may launch."""
    return [f"flash_attention_bwd_kernel<{ctype}, {w}>" for ctype in CTYPES.values() for w in HEAD_WIDTHS]


def backward(grad: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, causal: bool,
             scale: float) -> tuple[Any, Any, Any]:
    """(dq, dk, dv) of ``flash_attention.forward(q, k, v, causal, scale, with_lse=True)``,
    which gave ``out`` and ``lse``, for the output gradient ``grad`` [B, H, Lq, d]."""
    import cupy

    from .util import contiguous, pack_width

    if not scale > 0:
        raise ValueError(f"flash attention backward: scale must be > 0, got {scale}")
    b, h, lq, d = q.shape
    lk = k.shape[2]
    dk, dv = (cupy.empty((b, h, lk, d), dtype=q.dtype) for _ in range(2))
    if lq == 0 or lk == 0 or b * h == 0:
        dk.fill(0)
        dv.fill(0)
        return cupy.zeros(q.shape, dtype=q.dtype), dk, dv
    if not readable(grad):
        grad = contiguous(grad)
    item = q.dtype.itemsize

    rows = b * h * lq
    delta = cupy.empty((b, h, lq), dtype=cupy.float32)
    strides = [s // item for t in (out, grad) for s in t.strides[:3]]
    loader.kernel(SOURCE, "flash_attention_bwd_dot_kernel", q.dtype)(
        (-(-rows // 8),), (256,),
        (out, grad, delta, np.int64(rows), np.int32(h), np.int32(lq), np.int32(d), *(np.int64(s) for s in strides)))

    dq_acc = cupy.zeros((b, h, lq, d), dtype=cupy.float32)
    D = width(d)
    expression = f"flash_attention_bwd_kernel<{CTYPES[q.dtype.name]}, {D}>"
    if report.active:
        report.note_kernel(expression)
    # K and V, two stages each of Q and dout, dSᵀ [keys][queries + 8], two stages of lse and delta
    smem = (2 * KEYS + 4 * QUERY_ROWS) * (D + 8) * 2 + KEYS * (QUERY_ROWS + 8) * 2 + 4 * QUERY_ROWS * 4
    strides = [s // item for t in (q, k, v, grad) for s in t.strides[:3]]
    loader.sized_instance(SOURCE, expression, smem)(
        (-(-lk // KEYS), b * h), (THREADS,),
        (q, k, v, grad, lse, delta, dq_acc, dk, dv, np.int32(h), np.int32(lq), np.int32(lk), np.int32(d),
         np.float32(scale * math.log2(math.e)), np.float32(scale), np.int32(bool(causal)),
         *(np.int64(s) for s in strides)),
        shared_mem=smem)

    dq = cupy.empty(q.shape, dtype=q.dtype)
    n = dq.size
    loader.kernel(SOURCE, "flash_attention_bwd_dq_kernel", q.dtype)(
        (min(-(-n // (256 * pack_width(q.dtype))), 4096),), (256,), (dq_acc, dq, np.int64(n)))
    return dq, dk, dv

