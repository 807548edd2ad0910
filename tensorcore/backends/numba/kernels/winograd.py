"""Winograd F(4x4, 3x3) tile transforms for 3x3, stride-1 convolution (NCHW).

Each 4x4 output tile of a 3x3 convolution depends on one 6x6 input tile.  Winograd's
minimal filtering algorithm (Lavin & Gray 2015, interpolation points 0, ±1, ±2)
writes the tile as

    Y = A^T [(G g G^T) ⊙ (B^T d B)] A,

36 products per tile and channel pair instead of the direct form's 144.  Summed over
input channels, the element-wise products become 36 matrix products
``M[k] = U[k] @ V[k]`` ([Cout, C] @ [C, tiles]) that the backend runs as one batch
(``block_products.batched_matmul``), so the GEMM work drops 4x against im2col; the transformed input holds
36/16 = 2.25 values per output position and channel instead of im2col's 9.  The price is
rounding: the transforms scale values by up to ~100, so float32 results differ from
the direct sum by a few 1e-6 relative to the output's magnitude (float64 is exact
to ~1e-14).

Layouts: V [36, C, N*th*tw] and M [36, Cout, N*th*tw], tile t = (image, tile row,
tile column), th x tw tiles per output plane.  Every kernel runs one (channel,
image) plane per task; a row of tiles is transformed along the plane's columns with
contiguous vector loops, then along each tile's columns.  (``winograd_batch.py`` has
the same transforms for batches of small planes: one image per task, vectorised
across the channels.)

The kernel transforms U = G g G^T and its adjoint are linear maps of the 9 taps of
every (output channel, input channel) pair, so each is one BLAS product with the
Kronecker matrix G (x) G for all pairs at once.
"""

from __future__ import annotations

import numpy as np

from .jit import helper, inlined, kernel
from .parallel import parallel_for

TILE = 4  # output tile side; an input tile is TILE + 2 = 6 wide


@inlined
def _b_transform(t, d0, d1, d2, d3, d4, d5):
    """The six entries of B^T d for one column d0..d5 of an input tile."""
    two, four, five = t(2.0), t(4.0), t(5.0)
    return (four * d0 - five * d2 + d4,
            d3 + d4 - four * (d1 + d2),
            d4 - d3 + four * (d1 - d2),
            d4 - d2 + two * (d3 - d1),
            d4 - d2 + two * (d1 - d3),
            four * d1 - five * d3 + d5)


@inlined
def _a_transform(t, m0, m1, m2, m3, m4, m5):
    """The four entries of A^T m for one column m0..m5 of a transformed tile."""
    two, four, eight = t(2.0), t(4.0), t(8.0)
    p12, d12, p34, d34 = m1 + m2, m1 - m2, m3 + m4, m3 - m4
    return (m0 + p12 + p34, d12 + two * d34, p12 + four * p34, d12 + eight * d34 + m5)


@inlined
def _a_adjoint(t, y0, y1, y2, y3):
    """The six entries of A y for one column y0..y3 of an output-gradient tile."""
    two, four, eight = t(2.0), t(4.0), t(8.0)
    e02, e13 = y0 + y2, y1 + y3
    f02, f13 = y0 + four * y2, two * y1 + eight * y3
    return (y0, e02 + e13, e02 - e13, f02 + f13, f02 - f13, y3)


@helper
def _put6(dst, col, u):
    """dst[r, col] = u[r] for the six rows of dst (static tuple indices, so the
    stores vectorise along ``col``)."""
    dst[0, col], dst[1, col], dst[2, col] = u[0], u[1], u[2]
    dst[3, col], dst[4, col], dst[5, col] = u[3], u[4], u[5]


@helper
def _put4(dst, col, u):
    """dst[r, col] = u[r] for the four rows of dst."""
    dst[0, col], dst[1, col], dst[2, col], dst[3, col] = u[0], u[1], u[2], u[3]


@helper
def _padded_plane(src, rows, cols, top, left):
    """A zero [rows, cols] array with the 2-D ``src`` copied in at (top, left),
    cropped to fit."""
    plane = np.zeros((rows, cols), dtype=src.dtype)
    h, w = min(src.shape[0], rows - top), min(src.shape[1], cols - left)
    for r in range(h):
        for col in range(w):
            plane[top + r, left + col] = src[r, col]
    return plane


@helper
def _input_plane(task, v, x, ph, pw, th, tw, n, width, spans):
    """The tiles of the (channel, image) plane ``task`` of ``input_tiles_``."""
    t = x.dtype.type
    ch, i = task // n, task % n
    plane = _padded_plane(x[i, ch], TILE * th + 2, width, ph, pw)
    cols = np.empty((6, spans * TILE + TILE), dtype=x.dtype)
    for ty in range(th):
        d, dst = plane[TILE * ty:TILE * ty + 6], cols[:, ty * width:(ty + 1) * width]
        for j in range(width):
            _put6(dst, j, _b_transform(t, d[0, j], d[1, j], d[2, j], d[3, j], d[4, j], d[5, j]))
    tiles = np.empty((36, spans), dtype=x.dtype)
    for k in range(6):
        e = cols[k]
        dst = tiles[6 * k:6 * k + 6]
        for f in range(spans):
            s = TILE * f
            _put6(dst, f,
                  _b_transform(t, e[s], e[s + 1], e[s + 2], e[s + 3], e[s + 4], e[s + 5]))
    for kl in range(36):
        for ty in range(th):
            dst = v[kl, ch, (i * th + ty) * tw:(i * th + ty + 1) * tw]
            src = tiles[kl, ty * (tw + 1):ty * (tw + 1) + tw]
            for tx in range(tw):
                dst[tx] = src[tx]


@kernel
def input_tiles_(v, x, ph, pw, th, tw):
    """Fill v [36, C, N*th*tw] with B^T d B for the 6x6 tiles d of x [N, C, H, W];
    tile (ty, tx) starts at row 4*ty - ph and column 4*tx - pw (zero outside x).

    The column transform runs over all tiles of the plane in one loop: rows are
    padded to 4 * (tw + 1) values, so tile f of the flattened (row, column) grid
    starts at 4 * f; the spare tile at the end of each row is dropped."""
    n, c = x.shape[:2]
    width = TILE * (tw + 1)
    spans = th * (tw + 1)
    parallel_for(_input_plane, c * n, (v, x, ph, pw, th, tw, n, width, spans))


@helper
def _output_plane(task, m, y, n, ho, wo, th, tw, plane_tiles):
    """The (output channel, image) plane ``task`` of ``output_tiles_``."""
    t = m.dtype.type
    co, i = task // n, task % n
    g = m[:, co, i * plane_tiles:(i + 1) * plane_tiles]
    rows = np.empty((6, TILE, plane_tiles), dtype=m.dtype)
    for k in range(6):
        src, dst = g[6 * k:6 * k + 6], rows[k]
        for f in range(plane_tiles):
            _put4(dst, f, _a_transform(t, src[0, f], src[1, f], src[2, f],
                                       src[3, f], src[4, f], src[5, f]))
    out = np.empty((TILE, TILE * plane_tiles), dtype=m.dtype)
    for f in range(plane_tiles):
        for col in range(TILE):
            _put4(out, TILE * f + col, _a_transform(t, rows[0, col, f], rows[1, col, f],
                                                    rows[2, col, f], rows[3, col, f],
                                                    rows[4, col, f], rows[5, col, f]))
    for ty in range(th):
        for r in range(min(TILE, ho - TILE * ty)):
            dst, src = y[i, co, TILE * ty + r], out[r, TILE * ty * tw:]
            for col in range(wo):
                dst[col] = src[col]


@kernel
def output_tiles_(y, m, th, tw):
    """Fill y [N, Cout, Ho, Wo] from m [36, Cout, N*th*tw]: A^T m A per tile, the
    tiles cropped to the plane."""
    n, cout, ho, wo = y.shape
    plane_tiles = th * tw
    parallel_for(_output_plane, cout * n, (m, y, n, ho, wo, th, tw, plane_tiles))


@helper
def _grad_plane(task, mg, g, th, n, width, plane_tiles):
    """The tiles of the (output channel, image) plane ``task`` of ``grad_tiles_``."""
    t = g.dtype.type
    co, i = task // n, task % n
    plane = _padded_plane(g[i, co], TILE * th, width, 0, 0)
    cols = np.empty((6, th * width), dtype=g.dtype)
    for ty in range(th):
        d, dst = plane[TILE * ty:TILE * ty + TILE], cols[:, ty * width:(ty + 1) * width]
        for j in range(width):
            _put6(dst, j, _a_adjoint(t, d[0, j], d[1, j], d[2, j], d[3, j]))
    out = mg[:, co, i * plane_tiles:(i + 1) * plane_tiles]
    for k in range(6):
        e, dst = cols[k], out[6 * k:6 * k + 6]
        for f in range(plane_tiles):
            s = TILE * f
            _put6(dst, f, _a_adjoint(t, e[s], e[s + 1], e[s + 2], e[s + 3]))


@kernel
def grad_tiles_(mg, g, th, tw):
    """Fill mg [36, Cout, N*th*tw] with A dY A^T for the 4x4 tiles dY of the output
    gradient g [N, Cout, Ho, Wo] (zero past the plane's edge)."""
    n, cout = g.shape[:2]
    width = TILE * tw
    plane_tiles = th * tw
    parallel_for(_grad_plane, cout * n, (mg, g, th, n, width, plane_tiles))


# G (x) G, [36, 9]: row 6*k + l, column 3*a + b holds G[k, a] * G[l, b], so that
# (G g G^T)[k, l] = sum over (a, b) of (G (x) G)[6*k + l, 3*a + b] * g[a, b].  Its columns
# reversed map a kernel flipped in both axes, g[2 - a, 2 - b], the same way.
_G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
               [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])
_KRON_G = {(np.dtype(dtype), flipped): np.ascontiguousarray(np.kron(_G, _G)[:, ::-1] if flipped
                                                            else np.kron(_G, _G), dtype=dtype)
           for dtype in (np.float32, np.float64) for flipped in (False, True)}


def weight_tiles(w: np.ndarray, flipped: bool = False) -> np.ndarray:
    """U [36, A, B] for kernels w [A, B, 3, 3]: U[6*k + l, a, b] = (G g G^T)[k, l] for
    g = w[a, b] (flipped in both axes with ``flipped``, as the input gradient convolves
    with them), as one BLAS product (G (x) G) @ w over all kernels."""
    a, b = w.shape[:2]
    kernels = np.ascontiguousarray(w).reshape(a * b, 9)
    return np.matmul(_KRON_G[w.dtype, flipped], kernels.T).reshape(36, a, b)


def weight_grad(du: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """dw [Cout, C, 3, 3] = G^T dU G from du [36, Cout, C] (the adjoint of
    ``weight_tiles``), as one BLAS product (into ``out``, C-contiguous, when given)."""
    cout, c = du.shape[1:]
    dw = np.empty((cout, c, 3, 3), du.dtype) if out is None else out
    np.matmul(du.reshape(36, cout * c).T, _KRON_G[du.dtype, False], out=dw.reshape(cout * c, 9))
    return dw
