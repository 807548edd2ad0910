"""The epilogue of the fused LoRA linear: bias and the scaled low-rank product added to
the base product in place."""

from __future__ import annotations

import numpy as np

from .jit import helper, kernel
from .parallel import parallel_for


@helper
def _lora_epilogue_chunk_(c, out, bias, has_bias, xa, b, scale, rows, cols, rank, chunks):
    """``lora_epilogue_`` on chunk ``c``'s rows."""
    acc = np.empty(cols, dtype=out.dtype)
    for m in range(c * rows // chunks, (c + 1) * rows // chunks):
        row, a = out[m], xa[m]
        for n in range(cols):
            acc[n] = a[0] * b[0, n]
        for k in range(1, rank):
            ak, bk = a[k], b[k]
            for n in range(cols):
                acc[n] += ak * bk[n]
        if has_bias:
            for n in range(cols):
                row[n] = (row[n] + bias[n]) + scale * acc[n]
        else:
            for n in range(cols):
                row[n] += scale * acc[n]


@kernel
def lora_epilogue_(out, bias, has_bias, xa, b, scale, chunks):
    """``out[m, n] = (out[m, n] + bias[n]) + scale * sum_k xa[m, k] * b[k, n]`` for out
    [M, N], xa [M, R], b [R, N] (C-contiguous) and ``scale`` of out's dtype; the rows
    are split into ``chunks`` blocks, each with one row of scratch for the rank sum (R
    is small: the sum runs here, k outer, so the loop over n vectorises)."""
    rows, cols = out.shape
    rank = xa.shape[1]
    parallel_for(_lora_epilogue_chunk_, chunks, (out, bias, has_bias, xa, b, scale, rows, cols, rank, chunks))
