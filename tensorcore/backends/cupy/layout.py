"""Layout copies: a strided array made C-contiguous.

The common strided array on the GPU path is a batch of transposed matrices: the token
view [B, H·W, C] of an NCHW image that a transformer block's LayerNorm needs dense, and
the image view of tokens going back.  CuPy's copy kernel indexes such a view element by
element, reading one element per memory sector (21 µs for SD's 5 MB maps, about a
seventh of the copy rate).  ``dense_copy`` moves it with a tiled transpose through shared
memory (``cuda/transpose.cu``) instead, and hands every other layout to CuPy.
"""

from __future__ import annotations

from typing import Any

import cupy

from . import loader

SOURCE = "transpose.cu"
TILE, ROWS = 32, 8  # as in the kernel
_GRID_LIMIT = 65535  # gridDim.y and gridDim.z


def dense_copy(a: Any, out: Any = None) -> Any:
    """A C-contiguous copy of ``a`` (into ``out``, a C-contiguous array of its shape and
    dtype, when given)."""
    if out is None:
        out = cupy.empty(a.shape, dtype=a.dtype)
    if not _transposed_batch(a):
        out[...] = a
        return out
    rows, cols = a.shape[-2:]
    batch = a.size // (rows * cols)
    loader.kernel(SOURCE, "transpose_kernel", a.dtype)(
        (-(-rows // TILE), -(-cols // TILE), batch), (TILE, ROWS), (a, out, rows, cols))
    return out


def _transposed_batch(a: Any) -> bool:
    """Whether ``a`` is a C-contiguous array with its last two axes swapped, of a dtype the
    kernel is instantiated for and a size its grid covers."""
    if a.ndim < 2 or a.size == 0 or not loader.supports(a.dtype):
        return False
    rows, cols = a.shape[-2:]
    return rows > 1 and cols > 1 and a.swapaxes(-1, -2).flags.c_contiguous \
        and -(-cols // TILE) <= _GRID_LIMIT and a.size // (rows * cols) <= _GRID_LIMIT
