"""Tiled application of an image-to-image network, with linearly blended seams.

``tiled_apply`` cuts the input into overlapping square tiles, runs the network on each,
and fades every tile into its upper and left neighbours over the overlap with a linear
ramp, so no seam shows a step.  Tiles are processed row by row and only the finished
rows and the current row of tiles are kept, so memory is bounded by one row of tiles
(plus the output), whatever the image size.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

import tensorcore as tc
from tensorcore import Tensor


def blend(before: Tensor, after: Tensor, extent: int, axis: int) -> Tensor:
    """``after`` with its first ``extent`` lines along ``axis`` faded in from the last lines of ``before``.

    Line y of the overlap becomes ``before[-extent + y] * (1 - y/extent) + after[y] * (y/extent)``.
    """
    extent = min(before.shape[axis], after.shape[axis], extent)
    if extent <= 0:
        return after
    shape = [1] * after.ndim
    shape[axis] = extent
    ramp = tc.tensor((np.arange(extent) / extent).reshape(shape), dtype=after.dtype, device=after.device)
    size = after.shape[axis]
    tail = _take(before, axis, before.shape[axis] - extent, before.shape[axis])
    head = tail * (1.0 - ramp) + _take(after, axis, 0, extent) * ramp
    return tc.cat([head, _take(after, axis, extent, size)], axis=axis) if extent < size else head


def _take(x: Tensor, axis: int, start: int, stop: int) -> Tensor:
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop)
    return x[tuple(index)]


def tiled_apply(x: Tensor, fn: Callable[[Tensor], Tensor], tile_in: int, tile_out: int, overlap_factor: float) -> Tensor:
    """``fn`` over overlapping ``tile_in`` tiles of ``x`` [B, C, H, W], blended into one output.

    ``fn`` maps a ``tile_in`` tile to a ``tile_out`` tile (the network's scale is
    ``tile_out / tile_in``).  Tiles start every ``tile_in * (1 - overlap_factor)`` pixels;
    neighbouring outputs overlap by ``tile_out * overlap_factor`` lines, which are blended,
    and each tile contributes its first ``tile_out - blend`` lines (the last tile of a row
    or column contributes what it has).
    """
    stride = int(tile_in * (1 - overlap_factor))
    extent = int(tile_out * overlap_factor)
    keep = tile_out - extent
    if stride < 1 or keep < 1:
        raise ValueError(f"tiling: tile size {tile_in} with overlap {overlap_factor} leaves no stride (stride {stride}, kept {keep})")
    rows: list[Tensor] = []
    above: list[Tensor] = []  # the bottom `extent` lines of the previous row's blended tiles
    for top in range(0, x.shape[2], stride):
        row: list[Tensor] = []
        for left in range(0, x.shape[3], stride):
            tile = fn(x[:, :, top:top + tile_in, left:left + tile_in])
            if above:
                tile = blend(above[len(row)], tile, extent, axis=2)
            if row:
                tile = blend(row[-1], tile, extent, axis=3)
            row.append(tile)
        rows.append(tc.cat([tile[:, :, :keep, :keep] for tile in row], axis=3))
        above = [_bottom(tile, extent) for tile in row]
    return tc.cat(rows, axis=2)


def _bottom(tile: Tensor, lines: int) -> Tensor:
    """The last ``lines`` rows of ``tile``; a copy when no gradient is recorded, so the full tile can be freed."""
    part = tile[:, :, max(tile.shape[2] - lines, 0):]
    return part if tc.is_grad_enabled() and part.requires_grad else part.contiguous()
