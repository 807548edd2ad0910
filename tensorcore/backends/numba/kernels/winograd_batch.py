"""Winograd F(4x4, 3x3) tile transforms for batches of small planes: channels innermost.

``winograd.py`` transforms one (channel, image) plane per task, its vector loops
running along the plane's columns: right for large planes, but a 4x4 or 8x8 plane
(one or four tiles) leaves those loops a few values long.  These kernels run one
image per task and vectorise across the channels instead: the task copies its image
[C, H, W] into a zero-padded buffer [rows, columns, C] with the channel innermost
(register transposes, ``lane_maps.lane_transpose``), so that every transform is a
loop over C contiguous values (``lane_maps.lane_map``), and the output transform
writes its image back in NCHW order, with the bias and the activation, from such a
buffer.

Tile order: t = (image, tile row, tile column), each tile's 36 transformed values
for every channel together, the channel innermost: V [tiles, 36, C], M [tiles, 36,
Cout].  A task then writes (or reads) one contiguous block per tile; with the 36
values outermost, the 36 rows a tile writes lie a whole plane apart, and those
scattered stores took most of the transform's time.  The matrix products are
``M[:, k] = V[:, k] @ U[k]`` ([tiles, C] @ [C, Cout]) for the forward and
``dU[k] = dM[:, k]^T @ V[:, k]`` for the weight gradient, on strided views
(``block_products.py`` takes them as they lie).
"""

from __future__ import annotations

import numpy as np

from .activations import act_value
from .jit import helper, kernel, wide_vectors
from .lane_maps import lane_map, lane_transpose
from .parallel import parallel_for
from .winograd import TILE, _a_adjoint, _a_transform, _b_transform


@helper
def _input_image(i, v, x, ph, pw, th, tw, c, h, w, rows, cols):
    """The tiles of image ``i`` for ``input_tiles_``."""
    wide_vectors()
    plane = np.zeros((rows, cols, c), dtype=x.dtype)  # [C, h, w] -> [h, w, C] at (ph, pw)
    height, width = min(h, rows - ph), min(w, cols - pw)
    if width == w:  # whole image rows, a gap of the padding's columns after each
        lane_transpose(plane, (ph * cols + pw) * c, c, x, i * c * h * w, h * w, c, height * w, w, (cols - w) * c)
    else:
        for r in range(height):
            for q in range(width):
                for ch in range(c):
                    plane[ph + r, pw + q, ch] = x[i, ch, r, q]
    down = np.empty((6, cols, c), dtype=x.dtype)  # B^T d: each column of a tile row
    row = cols * c
    for ty in range(th):
        lane_map(_b_transform, down, 0, row, plane, TILE * ty * row, row, row)
        for tx in range(tw):
            tile = (i * th + ty) * tw + tx
            for k in range(6):
                lane_map(_b_transform, v, (36 * tile + 6 * k) * c, c, down, k * row + TILE * tx * c, c, c)


@kernel
def input_tiles_(v, x, ph, pw, th, tw):
    """Fill v [N*th*tw, 36, C] with B^T d B for the 6x6 tiles d of x [N, C, H, W];
    tile (ty, tx) starts at row 4*ty - ph and column 4*tx - pw (zero outside x)."""
    n, c, h, w = x.shape
    rows, cols = TILE * th + 2, TILE * tw + 2
    parallel_for(_input_image, n, (v, x, ph, pw, th, tw, c, h, w, rows, cols))


@helper
def _output_image(i, m, y, bias, code, ho, wo, th, tw, cout):
    """Image ``i`` of ``output_tiles_``."""
    wide_vectors()
    plane = np.empty((TILE * th, TILE * tw, cout), dtype=m.dtype)
    across = np.empty((6, TILE, cout), dtype=m.dtype)  # M A: each row of a tile
    row = TILE * tw * cout
    for ty in range(th):
        for tx in range(tw):
            tile = (i * th + ty) * tw + tx
            for k in range(6):
                lane_map(_a_transform, across, k * TILE * cout, cout, m, (36 * tile + 6 * k) * cout, cout, cout)
            lane_map(_a_transform, plane, TILE * (ty * row + tx * cout), row, across, 0, TILE * cout, TILE * cout)
    for co in range(cout):
        shift = bias[co]
        for r in range(ho):
            for q in range(wo):
                y[i, co, r, q] = act_value(code, plane[r, q, co] + shift)


@kernel
def output_tiles_(y, m, th, tw, bias, code):
    """Fill y [N, Cout, Ho, Wo] with act(A^T m A + bias) from m [N*th*tw, 36, Cout],
    the tiles cropped to the plane; ``code`` an ``ACT_CODES`` value."""
    n, cout, ho, wo = y.shape
    parallel_for(_output_image, n, (m, y, bias, code, ho, wo, th, tw, cout))


@helper
def _grad_image(i, mg, g, th, tw, cout, ho, wo, rows, cols):
    """The tiles of image ``i`` for ``grad_tiles_``."""
    wide_vectors()
    plane = np.zeros((rows, cols, cout), dtype=g.dtype)  # [C, ho, wo] -> [ho, wo, C], zero past the edge
    if wo == cols:  # the image's positions are the plane's first ones
        lane_transpose(plane, 0, cout, g, i * cout * ho * wo, ho * wo, cout, ho * wo, wo, 0)
    else:
        for r in range(ho):
            for q in range(wo):
                for co in range(cout):
                    plane[r, q, co] = g[i, co, r, q]
    down = np.empty((6, cols, cout), dtype=g.dtype)  # A dY: each column of a tile row
    row = cols * cout
    for ty in range(th):
        lane_map(_a_adjoint, down, 0, row, plane, TILE * ty * row, row, row)
        for tx in range(tw):
            tile = (i * th + ty) * tw + tx
            for k in range(6):
                lane_map(_a_adjoint, mg, (36 * tile + 6 * k) * cout, cout, down, k * row + TILE * tx * cout,
                         cout, cout)


@kernel
def grad_tiles_(mg, g, th, tw):
    """Fill mg [N*th*tw, 36, Cout] with A dY A^T for the 4x4 tiles dY of the output
    gradient g [N, Cout, Ho, Wo] (zero past the plane's edge)."""
    n, cout, ho, wo = g.shape
    rows, cols = TILE * th, TILE * tw
    parallel_for(_grad_image, n, (mg, g, th, tw, cout, ho, wo, rows, cols))
