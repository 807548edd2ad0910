"""Winograd F(4x4, 3x3) tile transforms for many small planes: the images innermost.

``winograd.py`` transforms one (channel, image) plane per task, its vector loops
running along the plane's columns: right for large planes, but a 4x4 or 8x8 plane
(one or four tiles) leaves those loops a few values long.  These kernels run one
channel per task instead and vectorise across the batch.  They read and write
channel-major arrays [C, N, H, W] (the backend swaps the leading axes with
``conv.swap_leading_axes`` / ``conv.unswap_bias_act``, which also applies a bias): a
channel's N planes are then one contiguous block, which the task copies into a
zero-padded buffer [rows, columns, N] with the image index innermost, so that every
transform is a loop over N contiguous values.  (Gathering the same values straight
from NCHW strides by C*H*W floats, often a multiple of 4 KiB: every load of a vector
then falls in the same L1 cache set.)

Tile order: t = (tile row, tile column, image), so V [36, C, th*tw*N] and
M [36, Cout, th*tw*N] hold, for one transform entry and one channel, the N images'
values of a tile position side by side.  The matrix products between the transforms
are the batched GEMMs of ``winograd.py``; only the order of the tiles differs.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .jit import kernel
from .winograd import TILE, _a_adjoint, _a_transform, _b_transform


@kernel
def input_tiles_(v, x_cm, ph, pw, th, tw):
    """Fill v [36, C, th*tw*N] with B^T d B for the 6x6 tiles d of x_cm [C, N, H, W];
    tile (ty, tx) starts at row 4*ty - ph and column 4*tx - pw (zero outside x)."""
    c, n, h, w = x_cm.shape
    t = x_cm.dtype.type
    rows, cols = TILE * th + 2, TILE * tw + 2
    for ch in prange(c):
        plane = np.zeros((rows, cols, n), dtype=x_cm.dtype)
        for r in range(min(h, rows - ph)):
            for q in range(min(w, cols - pw)):
                for i in range(n):
                    plane[ph + r, pw + q, i] = x_cm[ch, i, r, q]
        down = np.empty((6, cols, n), dtype=x_cm.dtype)  # B^T d: each column of a tile row
        for ty in range(th):
            r0 = TILE * ty
            for q in range(cols):
                for i in range(n):
                    e = _b_transform(t, plane[r0, q, i], plane[r0 + 1, q, i], plane[r0 + 2, q, i],
                                     plane[r0 + 3, q, i], plane[r0 + 4, q, i], plane[r0 + 5, q, i])
                    down[0, q, i], down[1, q, i], down[2, q, i] = e[0], e[1], e[2]
                    down[3, q, i], down[4, q, i], down[5, q, i] = e[3], e[4], e[5]
            for tx in range(tw):
                base, q0 = (ty * tw + tx) * n, TILE * tx
                for k in range(6):
                    for i in range(n):
                        u = _b_transform(t, down[k, q0, i], down[k, q0 + 1, i], down[k, q0 + 2, i],
                                         down[k, q0 + 3, i], down[k, q0 + 4, i], down[k, q0 + 5, i])
                        v[6 * k, ch, base + i], v[6 * k + 1, ch, base + i] = u[0], u[1]
                        v[6 * k + 2, ch, base + i], v[6 * k + 3, ch, base + i] = u[2], u[3]
                        v[6 * k + 4, ch, base + i], v[6 * k + 5, ch, base + i] = u[4], u[5]


@kernel
def output_tiles(m, ho, wo, th, tw):
    """y_cm [Cout, N, Ho, Wo] = A^T m A from m [36, Cout, th*tw*N], the tiles cropped
    to the plane."""
    cout = m.shape[1]
    n = m.shape[2] // (th * tw)
    t = m.dtype.type
    y_cm = np.empty((cout, n, ho, wo), dtype=m.dtype)
    for co in prange(cout):
        plane = np.empty((TILE * th, TILE * tw, n), dtype=m.dtype)
        across = np.empty((6, TILE, n), dtype=m.dtype)  # M A: each row of a tile
        for ty in range(th):
            for tx in range(tw):
                base = (ty * tw + tx) * n
                for k in range(6):
                    for i in range(n):
                        u = _a_transform(t, m[6 * k, co, base + i], m[6 * k + 1, co, base + i],
                                         m[6 * k + 2, co, base + i], m[6 * k + 3, co, base + i],
                                         m[6 * k + 4, co, base + i], m[6 * k + 5, co, base + i])
                        across[k, 0, i], across[k, 1, i], across[k, 2, i], across[k, 3, i] = u
                r0, q0 = TILE * ty, TILE * tx
                for q in range(TILE):
                    for i in range(n):
                        u = _a_transform(t, across[0, q, i], across[1, q, i], across[2, q, i],
                                         across[3, q, i], across[4, q, i], across[5, q, i])
                        plane[r0, q0 + q, i], plane[r0 + 1, q0 + q, i] = u[0], u[1]
                        plane[r0 + 2, q0 + q, i], plane[r0 + 3, q0 + q, i] = u[2], u[3]
        for r in range(ho):
            for q in range(wo):
                for i in range(n):
                    y_cm[co, i, r, q] = plane[r, q, i]
    return y_cm


@kernel
def grad_tiles_(mg, g_cm, th, tw):
    """Fill mg [36, Cout, th*tw*N] with A dY A^T for the 4x4 tiles dY of the output
    gradient g_cm [Cout, N, Ho, Wo] (zero past the plane's edge)."""
    cout, n, ho, wo = g_cm.shape
    t = g_cm.dtype.type
    rows, cols = TILE * th, TILE * tw
    for co in prange(cout):
        plane = np.zeros((rows, cols, n), dtype=g_cm.dtype)
        for r in range(ho):
            for q in range(wo):
                for i in range(n):
                    plane[r, q, i] = g_cm[co, i, r, q]
        down = np.empty((6, cols, n), dtype=g_cm.dtype)  # A dY: each column of a tile row
        for ty in range(th):
            r0 = TILE * ty
            for q in range(cols):
                for i in range(n):
                    e = _a_adjoint(t, plane[r0, q, i], plane[r0 + 1, q, i], plane[r0 + 2, q, i],
                                   plane[r0 + 3, q, i])
                    down[0, q, i], down[1, q, i], down[2, q, i] = e[0], e[1], e[2]
                    down[3, q, i], down[4, q, i], down[5, q, i] = e[3], e[4], e[5]
            for tx in range(tw):
                base, q0 = (ty * tw + tx) * n, TILE * tx
                for k in range(6):
                    for i in range(n):
                        u = _a_adjoint(t, down[k, q0, i], down[k, q0 + 1, i], down[k, q0 + 2, i],
                                       down[k, q0 + 3, i])
                        mg[6 * k, co, base + i], mg[6 * k + 1, co, base + i] = u[0], u[1]
                        mg[6 * k + 2, co, base + i], mg[6 * k + 3, co, base + i] = u[2], u[3]
                        mg[6 * k + 4, co, base + i], mg[6 * k + 5, co, base + i] = u[4], u[5]
