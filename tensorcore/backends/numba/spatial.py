"""Numba versions of convolution, pooling and upsampling (NCHW).

Convolution is parallel im2col / col2im plus one BLAS GEMM per group (NumPy's
``matmul`` on the column matrix); 3x3 stride-1 convolutions with enough channels run
all three passes through Winograd F(4x4, 3x3) tile transforms and 36 batched GEMMs
instead (``kernels/winograd.py`` for large planes, ``kernels/winograd_batch.py`` for
batches of small ones, ``kernels/block_products.py`` for the GEMMs), and thin
convolutions (few output channels per group) run direct loops without a column
matrix (``kernels/conv_direct.py``).  Shapes are
validated by the reference's checks before any kernel runs; other dtypes defer to
the NumPy reference.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

import numpy as np

from .kernels import fast_path
from ..numpy.pool import _pool_geometry
from ..numpy.upsample import check_image

Array = Any
Pair = tuple[int, int]
Shape = tuple[int, ...]


# ----- which algorithm a convolution pass runs -------------------------------------------
WINOGRAD, WINOGRAD_BATCH, SUBSAMPLED = "winograd", "winograd_batch", "subsampled"
POINTWISE = "pointwise"
DIRECT, FEW_OUT, IM2COL = "direct", "few_out", "im2col"
SMALL_K = 16  # contractions (C/groups * kh * kw) up to this length skip BLAS
FEW_OUT_MAX = 4  # output channels per group up to which stride-1 kernels larger than
#                  1x1 run direct loops (1x1 and strided ones: with one output channel)
BATCH_MIN_IMAGES = 16  # WINOGRAD_BATCH: images (one task each, 1+ GEMM rows each) at least
BATCH_MIN_CHANNELS = 16  # and channels on each side
SUBSAMPLED_MAX_TILES = 4  # SUBSAMPLED: Winograd tiles of the stride-1 output plane (at most)


def conv_algorithm(pass_name: str, w_shape: Shape, stride: Pair, padding: Pair,
                   dilation: Pair, groups: int, n: int, plane_hw: Pair) -> str:
    """The algorithm of one pass ("forward", "grad_input", "grad_weight") of a
    convolution with weight ``w_shape`` over ``n`` images, ``plane_hw`` being the output
    plane (the input plane for "grad_input", which Winograd computes as a convolution):

    * FEW_OUT, direct loops without a column matrix or BLAS (``kernels/conv_direct.py``),
      for all three passes of thin convolutions: one output channel per group, or up
      to FEW_OUT_MAX for stride-1 kernels larger than 1x1.  There the GEMM is a
      matrix-vector product, the column matrix (kh*kw times the input's size) costs far
      more than the arithmetic, and with one output channel the input gradient's
      product is an outer product that NumPy runs without BLAS.  The direct loops pad
      whole input planes, so 1x1 and strided kernels gain less from them;
    * WINOGRAD, F(4x4, 3x3), for 3x3 stride-1 undilated ungrouped convolutions whose 36
      batched [Cout, C] @ [C, tiles] products run at BLAS speed: 64+ channels on both
      sides, planes of 64+ tiles, 1024+ tiles in all (and padding <= 2 for "grad_input");
    * WINOGRAD_BATCH, the same with one image per task and the transforms vectorised
      across the channels, for such convolutions on smaller planes: BATCH_MIN_IMAGES+ images, BATCH_MIN_CHANNELS+
      channels on both sides;
    * SUBSAMPLED, a stride-2 3x3 convolution as the stride-1 one (WINOGRAD_BATCH) read at
      every other output (its gradients: the stride-1 ones of the output gradient with
      zeros between its values), for planes whose stride-1 output holds up to
      SUBSAMPLED_MAX_TILES tiles (8x8): 4x the outputs at a quarter of the products
      each, and no strided im2col, whose rows are then a few values long;
    * POINTWISE, for the forward and the input gradient of 1x1 stride-1 unpadded
      convolutions: one BLAS GEMM per image on the NCHW arrays as they are, no column
      matrix, no layout swap (their weight gradient is IM2COL, whose column matrix
      is then the input in channel-major order);
    * DIRECT, a loop without BLAS, for short contractions (forward and weight gradient);
    * IM2COL, parallel im2col / col2im and a BLAS GEMM per group, otherwise.

    The thresholds come from the measurements in docs/benchmarks.md#cpu-convolution-algorithms."""
    per_group = w_shape[0] // groups
    if per_group == 1 or (per_group <= FEW_OUT_MAX and tuple(stride) == (1, 1)
                          and w_shape[2] * w_shape[3] > 1):
        return FEW_OUT
    if (tuple(w_shape[2:]) == (3, 3) and tuple(dilation) == (1, 1) and groups == 1
            and (pass_name != "grad_input" or max(padding) <= 2)):
        channels = min(w_shape[0], w_shape[1])
        batch = channels >= BATCH_MIN_CHANNELS and n >= BATCH_MIN_IMAGES
        if tuple(stride) == (1, 1):
            tiles = math.prod(_tile_grid(plane_hw))
            if channels >= 64 and tiles >= 64 and n * tiles >= 1024:
                return WINOGRAD
            if batch and tiles < 64:
                return WINOGRAD_BATCH
        elif tuple(stride) == (2, 2) and batch:
            dense = _dense_plane(pass_name, plane_hw, padding)
            if math.prod(_tile_grid(dense)) <= SUBSAMPLED_MAX_TILES:
                return SUBSAMPLED
    small_k = w_shape[1] * w_shape[2] * w_shape[3] <= SMALL_K
    if _pointwise(w_shape, stride, padding) and pass_name != "grad_weight" and not (
            small_k and pass_name == "forward"):
        return POINTWISE
    if pass_name == "grad_input":
        return IM2COL
    return DIRECT if small_k else IM2COL


def _dense_plane(pass_name: str, plane_hw: Pair, padding: Pair) -> Pair:
    """The output plane of a stride-2 3x3 convolution run at stride 1, from the plane
    ``conv_algorithm`` is given (for the output planes: its largest size)."""
    if pass_name == "grad_input":
        return _stride_one_plane(plane_hw, padding)
    return 2 * plane_hw[0], 2 * plane_hw[1]


def _stride_one_plane(x_hw: Pair, padding: Pair) -> Pair:
    """The output plane of a 3x3 stride-1 convolution of an ``x_hw`` plane."""
    return x_hw[0] + 2 * padding[0] - 2, x_hw[1] + 2 * padding[1] - 2


def _zeros_between(grad: Array, stride: Pair, dense_hw: Pair) -> Array:
    """The output gradient of a strided convolution placed at every stride-th value of
    the stride-1 convolution's output plane ``dense_hw``, zeros elsewhere."""
    n, cout, ho, wo = grad.shape
    dense = np.zeros((n, cout) + tuple(dense_hw), dtype=grad.dtype)
    dense[:, :, :ho * stride[0]:stride[0], :wo * stride[1]:stride[1]] = grad
    return dense


def _target(dest: Array | None, shape: Shape, dtype: Any) -> Array:
    """``dest`` (a C-contiguous array of the result's shape and dtype), else a new array."""
    return np.empty(shape, dtype) if dest is None else dest


def _pointwise(w_shape: Shape, stride: Pair, padding: Pair) -> bool:
    """A 1x1 kernel at stride 1 without padding: every output pixel is a product of the
    weight matrix with the input pixel's channels."""
    return tuple(w_shape[2:]) == (1, 1) and tuple(stride) == (1, 1) and tuple(padding) == (0, 0)


def _small_same_plane(x_shape: Shape, stride: Pair, out_hw: Pair) -> bool:
    """True for a stride-1 convolution whose output plane is the input plane's size
    and small (under 128 values): im2col / col2im then work on the channel-major
    layout, one long shifted copy per tap instead of one short copy per plane."""
    return (stride == (1, 1) and tuple(x_shape[2:]) == tuple(out_hw)
            and out_hw[0] * out_hw[1] < 128)


class Scratch:
    """Growable buffers for the convolution temporaries (the column matrix, the Winograd
    transforms), one per (thread, dtype, slot), owned by the backend.  A thread's buffers
    go with the thread; ``clear`` drops them all (a buffer in use lives on through its
    views until the call that took it returns)."""

    def __init__(self) -> None:
        self._buffers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def take(self, size: int, dtype: Any, slot: int = 0) -> Array:
        """A flat array of ``size`` elements of ``dtype``; its contents are garbage and
        stay valid until this thread's next ``take`` of the same slot."""
        mine = self._buffers.setdefault(threading.current_thread(), {})
        key = (np.dtype(dtype), slot)
        buf = mine.get(key)
        if buf is None or buf.size < size:
            buf = mine[key] = np.empty(size, dtype)
        return buf[:size]

    def clear(self) -> None:
        self._buffers.clear()


def _bilinear_taps(in_size: int, out_size: int, align_corners: bool,
                   dtype: Any) -> tuple[Array, Array, Array]:
    """(lo, hi, weight of hi) per output index, PyTorch's source-index rule."""
    dst = np.arange(out_size, dtype=np.float64)
    if align_corners:
        src = dst * ((in_size - 1) / (out_size - 1) if out_size > 1 else 0.0)
    else:
        src = np.maximum((dst + 0.5) * (in_size / out_size) - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    hi = np.minimum(lo + 1, in_size - 1)
    return lo, hi, np.clip(src - lo, 0.0, 1.0).astype(dtype)


def _tile_grid(out_hw: Pair) -> Pair:
    """Winograd output tiles per plane, (rows, columns)."""
    from .kernels.winograd import TILE

    return -(-out_hw[0] // TILE), -(-out_hw[1] // TILE)


def _winograd_input(scratch: Scratch, x: Array, padding: Pair, out_hw: Pair,
                    batch: bool) -> tuple[Array, Pair]:
    """The transformed input V (in this thread's scratch slot 1) and the tile grid:
    [36, C, tiles] in ``winograd``'s layout; with ``batch``, a [36, tiles, C] view of
    ``winograd_batch``'s [tiles, 36, C]."""
    from .kernels import winograd, winograd_batch

    n, c = x.shape[:2]
    tiles = _tile_grid(out_hw)
    size = 36 * c * n * tiles[0] * tiles[1]
    x = np.ascontiguousarray(x)
    if batch:
        v = scratch.take(size, x.dtype, 1).reshape(-1, 36, c)
        winograd_batch.input_tiles_(v, x, *padding, *tiles)
        v = v.transpose(1, 0, 2)
    else:
        v = scratch.take(size, x.dtype, 1).reshape(36, c, -1)
        winograd.input_tiles_(v, x, *padding, *tiles)
    return v, tiles


def _tile_products(scratch: Scratch, a: Array, b: Array, tile_major: bool = False) -> Array:
    """The 36 GEMMs a[k] @ b[k] (in this thread's scratch slot 2), [36, M, N]; with
    ``tile_major`` a view of [M, 36, N] memory (``winograd_batch``'s layout)."""
    from .kernels.block_products import batched_matmul

    m = scratch.take(36 * a.shape[1] * b.shape[2], b.dtype, 2)
    m = m.reshape(a.shape[1], 36, b.shape[2]).transpose(1, 0, 2) if tile_major else \
        m.reshape(36, a.shape[1], b.shape[2])
    return batched_matmul(a, b, m)


def _winograd_conv(scratch: Scratch, x: Array, u: Array, padding: Pair, y: Array) -> Array:
    """y [N, Cout, Ho, Wo] (C-contiguous) = the stride-1 3x3 convolution of x [N, C, H, W]
    with the transformed kernels u [36, Cout, C] by Winograd F(4x4, 3x3): transform,
    36 batched GEMMs, inverse transform."""
    from .kernels import winograd

    v, tiles = _winograd_input(scratch, x, padding, y.shape[2:], batch=False)
    winograd.output_tiles_(y, _tile_products(scratch, u, v), *tiles)
    return y


def _winograd_batch_conv(scratch: Scratch, x: Array, u: Array, padding: Pair, y: Array,
                         shift: Array, code: int) -> Array:
    """``_winograd_conv`` in ``winograd_batch``'s layout, the kernels u [36, C, Cout]:
    y = act(conv + shift), the epilogue applied as the output transform writes y."""
    from .kernels import winograd_batch

    v, tiles = _winograd_input(scratch, x, padding, y.shape[2:], batch=True)
    m = _tile_products(scratch, v, u, tile_major=True).transpose(1, 0, 2)
    winograd_batch.output_tiles_(y, m, *tiles, shift, code)
    return y


def _winograd_weight_grad(scratch: Scratch, grad: Array, x: Array, padding: Pair,
                          batch: bool, out: Array | None = None) -> Array:
    """dL/dw [Cout, C, 3, 3] (into ``out`` when given) of a Winograd-shaped convolution:
    G^T (dM @ V^T) G with dM = A dY A^T per tile."""
    from .kernels import winograd, winograd_batch
    from .kernels.block_products import batched_matmul

    v, tiles = _winograd_input(scratch, x, padding, grad.shape[2:], batch)
    cout = grad.shape[1]
    size = 36 * cout * grad.shape[0] * tiles[0] * tiles[1]
    grad = np.ascontiguousarray(grad)
    if batch:
        mg = scratch.take(size, grad.dtype, 2).reshape(-1, 36, cout)
        winograd_batch.grad_tiles_(mg, grad, *tiles)
        du = batched_matmul(mg.transpose(1, 2, 0), v)
    else:
        mg = scratch.take(size, grad.dtype, 2).reshape(36, cout, -1)
        winograd.grad_tiles_(mg, grad, *tiles)
        du = np.matmul(mg, v.transpose(0, 2, 1))
    return winograd.weight_grad(du, out)


class NumbaSpatialKernels:
    """conv2d (+ both gradients), max/avg pooling, nearest/bilinear upsampling."""

    scratch: Scratch  # the convolution temporaries (NumbaBackend owns it)

    # ----- convolution -------------------------------------------------------------
    def _columns(self, x: Array, kernel: Pair, out_hw: Pair, stride: Pair, padding: Pair,
                 dilation: Pair, groups: int) -> Array:
        """x [N, C, H, W] -> column matrix [groups, C/groups * kh * kw, N * Ho * Wo],
        in this thread's scratch buffer (valid until the next call)."""
        from .kernels import conv as K

        n, c = x.shape[:2]
        x = np.ascontiguousarray(x)
        if _pointwise((0, 0) + tuple(kernel), stride, padding):  # the columns are x, channel-major
            return K.swap_leading_axes(x).reshape(groups, -1, n * out_hw[0] * out_hw[1])
        shape = (c, kernel[0], kernel[1], n, out_hw[0] * out_hw[1])
        cols = self.scratch.take(math.prod(shape), x.dtype).reshape(shape)
        if _small_same_plane(x.shape, stride, out_hw):
            K.im2col_same_(cols, K.swap_leading_axes(x), *padding, *dilation)
        else:
            K.im2col_(cols, x, *stride, *padding, *dilation, *out_hw)
        return cols.reshape(groups, -1, n * out_hw[0] * out_hw[1])

    @staticmethod
    def _grad_columns(grad: Array, groups: int) -> Array:
        """grad [N, Cout, Ho, Wo] -> [groups, Cout/groups, N * Ho * Wo]."""
        from .kernels import conv as K

        n, cout, ho, wo = grad.shape
        return K.swap_leading_axes(np.ascontiguousarray(grad)).reshape(groups, cout // groups,
                                                                        n * ho * wo)

    def conv2d(self, x: Array, w: Array, stride: Pair, padding: Pair, dilation: Pair,
               groups: int, bias: Array | None = None, act: str = "none",
               residual: Array | None = None, residual_scale: float = 1.0,
               out: Array | None = None) -> Array:
        """The reference's conv2d with its epilogue; with ``out`` the kernels write the
        result there where they can (the residual added and the scale applied in place)."""
        if not fast_path(x, w):
            return super().conv2d(x, w, stride, padding, dilation, groups, bias, act, residual,
                                  residual_scale, out=out)
        ho, wo = self._conv_geometry("conv2d", x.shape, w.shape, stride, padding, dilation, groups)
        self._check_epilogue("conv2d", (x.shape[0], w.shape[0], ho, wo), bias, act, residual)
        self._check_out("conv2d", out, (x.shape[0], w.shape[0], ho, wo), x.dtype)
        if bias is not None and not fast_path(x, bias):  # the generic epilogue converts it
            y = self._conv2d_plain(x, w, stride, padding, dilation, groups, (ho, wo), None, "none")
            return self._into(out, self._conv_epilogue(y, bias, act, residual, residual_scale))
        y = self._conv2d_plain(x, w, stride, padding, dilation, groups, (ho, wo), bias, act, out)
        if y is not out or (residual is not None and not fast_path(y, residual)):
            return self._into(out, self._conv_epilogue(y, None, "none", residual, residual_scale))
        if residual is not None:  # the epilogue's add and multiply, in place
            self.binary("add", y, residual, out=y)
        if residual_scale != 1.0:
            self.binary("mul", y, self.full((), residual_scale, y.dtype), out=y)
        return y

    def _conv2d_plain(self, x: Array, w: Array, stride: Pair, padding: Pair, dilation: Pair,
                      groups: int, out_hw: Pair, bias: Array | None, act: str,
                      dest: Array | None = None) -> Array:
        """act(conv2d(x, w) + bias), written into ``dest`` (C-contiguous, of the result's
        shape and dtype) where the algorithm's kernels can write it; the direct,
        few-output and im2col paths apply the bias and the activation as they write the
        output in NCHW order, sparing a pass over it."""
        from .kernels import conv as K
        from .kernels.activations import ACT_CODES
        from .kernels.winograd import weight_tiles

        ho, wo = out_hw
        algorithm = conv_algorithm("forward", w.shape, stride, padding, dilation, groups,
                                   x.shape[0], (ho, wo))
        n, cout, kh, kw = x.shape[0], w.shape[0], w.shape[2], w.shape[3]
        shape = (n, cout, ho, wo)
        plain = bias is None and act == "none"  # nothing to apply after the product
        if algorithm in (WINOGRAD, POINTWISE):  # the product into dest, unless the epilogue follows
            y = dest if dest is not None and plain else np.empty(shape, x.dtype)
            if algorithm == WINOGRAD:
                _winograd_conv(self.scratch, x, weight_tiles(w), padding, y)
            else:
                np.matmul(np.ascontiguousarray(w).reshape(groups, cout // groups, -1),
                          x.reshape(n, groups, -1, ho * wo), out=y.reshape(n, groups, cout // groups, ho * wo))
            return y if plain else self.bias_act(y, bias, act, 1)
        shift = np.zeros(cout, x.dtype) if bias is None else np.ascontiguousarray(bias)
        if algorithm == WINOGRAD_BATCH:
            return _winograd_batch_conv(self.scratch, x, weight_tiles(w.transpose(1, 0, 2, 3)), padding,
                                        _target(dest, shape, x.dtype), shift, ACT_CODES[act])
        if algorithm == SUBSAMPLED:
            dense_hw = _stride_one_plane(x.shape[2:], padding)
            dense = self._conv2d_plain(x, w, (1, 1), padding, dilation, groups, dense_hw, bias, act)
            y = _target(dest, shape, x.dtype)
            y[...] = dense[:, :, :ho * stride[0]:stride[0], :wo * stride[1]:stride[1]]
            return y
        if algorithm == FEW_OUT:
            from .kernels import conv_direct as D

            y = _target(dest, shape, x.dtype)
            D.forward_(y, np.ascontiguousarray(x), np.ascontiguousarray(w), shift,
                       ACT_CODES[act], *stride, *padding, *dilation)
            return y
        cols = self._columns(x, (kh, kw), (ho, wo), stride, padding, dilation, groups)
        w_rows = np.ascontiguousarray(w).reshape(groups, cout // groups, -1)
        if algorithm == DIRECT:
            y = _target(dest, shape, x.dtype)
            K.small_k_forward_(y.reshape(n, cout, ho * wo), w_rows, cols.reshape(groups, -1, n, ho * wo), shift,
                               ACT_CODES[act])
            return y
        return K.unswap_bias_act(np.matmul(w_rows, cols).reshape(cout, n, ho * wo), shift,
                                 ACT_CODES[act]).reshape(n, cout, ho, wo)

    def conv2d_grad_input(self, grad: Array, w: Array, x_shape: Shape, stride: Pair,
                          padding: Pair, dilation: Pair, groups: int, out: Array | None = None) -> Array:
        """The reference's input gradient, written into ``out`` when given (a C-contiguous
        array of the input's shape and dtype, as ``conv2d``'s ``out``)."""
        if not fast_path(grad, w):
            y = super().conv2d_grad_input(grad, w, x_shape, stride, padding, dilation, groups)
            self._check_out("conv2d_grad_input", out, y.shape, y.dtype)
            return self._into(out, y)
        from .kernels import conv as K

        ho, wo = self._conv_grad_geometry("conv2d_grad_input", grad, x_shape, w.shape, stride,
                                          padding, dilation, groups)
        self._check_out("conv2d_grad_input", out, x_shape, w.dtype)
        n, c, h, wd = x_shape
        cout, kh, kw = w.shape[0], w.shape[2], w.shape[3]
        algorithm = conv_algorithm("grad_input", w.shape, stride, padding, dilation, groups, n,
                                   (h, wd))
        if algorithm == SUBSAMPLED:
            dense = _zeros_between(grad, stride, _stride_one_plane((h, wd), padding))
            return self.conv2d_grad_input(dense, w, x_shape, (1, 1), padding, dilation, groups, out=out)
        dx = _target(out, (n, c, h, wd), w.dtype)
        if algorithm == FEW_OUT:
            from .kernels import conv_direct as D

            D.grad_input_(dx, np.ascontiguousarray(grad), np.ascontiguousarray(w), *stride,
                          *padding, *dilation)
            return dx
        if algorithm in (WINOGRAD, WINOGRAD_BATCH):
            from .kernels.activations import ACT_CODES
            from .kernels.winograd import weight_tiles

            # a stride-1 convolution's input gradient is the "full" convolution of the
            # output gradient with the flipped, transposed kernel
            full = (2 - padding[0], 2 - padding[1])
            if algorithm == WINOGRAD:
                u = weight_tiles(w.transpose(1, 0, 2, 3), flipped=True)
                return _winograd_conv(self.scratch, grad, u, full, dx)
            return _winograd_batch_conv(self.scratch, grad, weight_tiles(w, flipped=True), full,
                                        dx, np.zeros(c, w.dtype), ACT_CODES["none"])
        w_rows = np.ascontiguousarray(w).reshape(groups, cout // groups, -1)
        if algorithm == POINTWISE:
            np.matmul(w_rows.transpose(0, 2, 1), grad.reshape(n, groups, cout // groups, h * wd),
                      out=dx.reshape(n, groups, c // groups, h * wd))
            return dx
        shape = (c, kh, kw, n, ho * wo)
        cols = self.scratch.take(math.prod(shape), w.dtype).reshape(groups, -1, n * ho * wo)
        # cols = w^T grad, computed as its transpose grad^T w written through a transposed
        # view: BLAS runs the product with the pixels as its long row axis faster
        np.matmul(self._grad_columns(grad, groups).transpose(0, 2, 1), w_rows,
                  out=cols.transpose(0, 2, 1))
        if _small_same_plane(x_shape, stride, (ho, wo)):
            K.col2im_same_(dx, cols.reshape(shape), *padding, *dilation)
        else:
            K.col2im_(dx, cols.reshape(shape), *stride, *padding, *dilation, ho, wo)
        return dx

    def conv2d_grad_weight(self, grad: Array, x: Array, w_shape: Shape, stride: Pair,
                           padding: Pair, dilation: Pair, groups: int, out: Array | None = None) -> Array:
        """The reference's weight gradient, written into ``out`` when given (a C-contiguous
        array of the weight's shape and dtype, as ``conv2d``'s ``out``)."""
        if not fast_path(grad, x):
            dw = super().conv2d_grad_weight(grad, x, w_shape, stride, padding, dilation, groups)
            self._check_out("conv2d_grad_weight", out, dw.shape, dw.dtype)
            return self._into(out, dw)
        ho, wo = self._conv_grad_geometry("conv2d_grad_weight", grad, x.shape, w_shape, stride,
                                          padding, dilation, groups)
        self._check_out("conv2d_grad_weight", out, w_shape, x.dtype)
        algorithm = conv_algorithm("grad_weight", w_shape, stride, padding, dilation, groups,
                                   x.shape[0], (ho, wo))
        if algorithm == SUBSAMPLED:
            dense = _zeros_between(grad, stride, _stride_one_plane(x.shape[2:], padding))
            return self.conv2d_grad_weight(dense, x, w_shape, (1, 1), padding, dilation, groups, out=out)
        if algorithm in (WINOGRAD, WINOGRAD_BATCH):
            return _winograd_weight_grad(self.scratch, grad, x, padding,
                                         batch=algorithm == WINOGRAD_BATCH, out=out)
        if algorithm == FEW_OUT:
            from .kernels import conv_direct as D

            return self._into(out, D.grad_weight(np.ascontiguousarray(grad), np.ascontiguousarray(x), groups,
                                                 w_shape[2], w_shape[3], *stride, *padding, *dilation))
        cols = self._columns(x, (w_shape[2], w_shape[3]), (ho, wo), stride, padding, dilation,
                             groups)
        if algorithm == DIRECT:
            from .kernels import conv as K

            n, cout = grad.shape[:2]
            dw = K.small_k_weight_grad(np.ascontiguousarray(grad).reshape(n, cout, -1),
                                       cols.reshape(groups, cols.shape[1], n, -1))
            return self._into(out, dw.reshape(w_shape))
        # computed transposed, [groups, K, Cout/groups]: BLAS runs this shape (long
        # contraction, the wide column matrix as the left operand) faster
        dw_t = np.matmul(cols, self._grad_columns(grad, groups).transpose(0, 2, 1))
        dw = _target(out, w_shape, x.dtype)
        dw.reshape(dw_t.shape[0], dw_t.shape[2], dw_t.shape[1])[...] = dw_t.transpose(0, 2, 1)
        return dw

    # ----- pooling -----------------------------------------------------------------
    def max_pool2d(self, x: Array, kernel: Pair, stride: Pair,
                   padding: Pair) -> tuple[Array, Array]:
        if not fast_path(x):
            return super().max_pool2d(x, kernel, stride, padding)
        from .kernels import pooling as K

        ho, wo = _pool_geometry("max_pool2d", x.shape, kernel, stride, padding)
        return K.max_pool(np.ascontiguousarray(x), *kernel, *stride, *padding, ho, wo)

    def max_pool2d_backward(self, grad: Array, argmax: Array, x_shape: Shape) -> Array:
        if not fast_path(grad) or argmax.shape != grad.shape or grad.size == 0:
            return super().max_pool2d_backward(grad, argmax, x_shape)
        from .kernels import pooling as K

        dx, ok = K.max_pool_backward(np.ascontiguousarray(grad),
                                     np.ascontiguousarray(argmax, dtype=np.int64),
                                     x_shape[2], x_shape[3])
        if not ok:
            raise ValueError(f"max_pool2d_backward: argmax values must lie in "
                             f"[0, {x_shape[2] * x_shape[3]}) for input shape {tuple(x_shape)}")
        return dx

    def avg_pool2d(self, x: Array, kernel: Pair, stride: Pair, padding: Pair) -> Array:
        if not fast_path(x):
            return super().avg_pool2d(x, kernel, stride, padding)
        from .kernels import pooling as K

        ho, wo = _pool_geometry("avg_pool2d", x.shape, kernel, stride, padding)
        return K.avg_pool(np.ascontiguousarray(x), *kernel, *stride, *padding, ho, wo)

    def avg_pool2d_backward(self, grad: Array, x_shape: Shape, kernel: Pair,
                            stride: Pair, padding: Pair) -> Array:
        if not fast_path(grad):
            return super().avg_pool2d_backward(grad, x_shape, kernel, stride, padding)
        from .kernels import pooling as K

        ho, wo = _pool_geometry("avg_pool2d_backward", x_shape, kernel, stride, padding)
        if tuple(grad.shape) != tuple(x_shape[:2]) + (ho, wo):
            raise ValueError(f"avg_pool2d_backward: grad has shape {tuple(grad.shape)}, "
                             f"expected {tuple(x_shape[:2]) + (ho, wo)}")
        return K.avg_pool_backward(np.ascontiguousarray(grad), x_shape[2], x_shape[3],
                                   *kernel, *stride, *padding)

    # ----- upsampling --------------------------------------------------------------
    def upsample_nearest2d(self, x: Array, out_hw: Pair) -> Array:
        if not fast_path(x):
            return super().upsample_nearest2d(x, out_hw)
        from .kernels import pooling as K

        check_image("upsample_nearest2d", x.shape, out_hw)
        rows = self._nearest_source(x.shape[2], out_hw[0])
        cols = self._nearest_source(x.shape[3], out_hw[1])
        return K.gather_nearest(np.ascontiguousarray(x), rows, cols)

    def upsample_nearest2d_backward(self, grad: Array, x_shape: Shape) -> Array:
        if not fast_path(grad) or grad.ndim != 4:
            return super().upsample_nearest2d_backward(grad, x_shape)
        from .kernels import pooling as K

        check_image("upsample_nearest2d_backward", x_shape)
        rows = self._nearest_source(x_shape[2], grad.shape[2])
        cols = self._nearest_source(x_shape[3], grad.shape[3])
        return K.scatter_nearest(np.ascontiguousarray(grad), rows, cols, x_shape[2], x_shape[3])

    def upsample_bilinear2d(self, x: Array, out_hw: Pair, align_corners: bool) -> Array:
        if not fast_path(x):
            return super().upsample_bilinear2d(x, out_hw, align_corners)
        from .kernels import pooling as K

        check_image("upsample_bilinear2d", x.shape, out_hw)
        taps_h = _bilinear_taps(x.shape[2], out_hw[0], align_corners, x.dtype)
        taps_w = _bilinear_taps(x.shape[3], out_hw[1], align_corners, x.dtype)
        return K.bilinear(np.ascontiguousarray(x), *taps_h, *taps_w)

    def upsample_bilinear2d_backward(self, grad: Array, x_shape: Shape,
                                     align_corners: bool) -> Array:
        if not fast_path(grad) or grad.ndim != 4:
            return super().upsample_bilinear2d_backward(grad, x_shape, align_corners)
        from .kernels import pooling as K

        check_image("upsample_bilinear2d_backward", x_shape)
        taps_h = _bilinear_taps(x_shape[2], grad.shape[2], align_corners, grad.dtype)
        taps_w = _bilinear_taps(x_shape[3], grad.shape[3], align_corners, grad.dtype)
        return K.bilinear_backward(np.ascontiguousarray(grad), x_shape[2], x_shape[3],
                                   *taps_h, *taps_w)
