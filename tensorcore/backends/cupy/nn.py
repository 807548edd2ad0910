"""CuPy overrides for the softmax family, normalisation, pooling, resampling and
embedding backward (RawKernels in cuda/softmax.cu, layernorm.cu, planenorm.cu, pool.cu,
upsample.cu, embedding.cu).  Inputs the kernels do not cover go to the xp reference,
which also raises the errors for invalid shapes."""

from __future__ import annotations

from typing import Any

import cupy
import numpy

from . import loader, planes
from .loader import kernel, launch
from .elementwise import ACT_CODES
from .groupnorm import one_pass_group_norm
from .util import (INT32_LIMIT, acc_dtype, aligned, as_rows, contiguous, empty_as,
                   has_kernels, pack_width, ptr, row_launch, zeroed_counters)
from ..numpy.act import check_activation
from ..numpy.pool import _pool_geometry
from ..numpy.upsample import check_image

SOFTMAX, LN = "softmax.cu", "layernorm.cu"
PLANE = planes.PLANE
POOL, UPSAMPLE, EMBED = "pool.cu", "upsample.cu", "embedding.cu"
THREADS = 256
ROW_PACKS = 8  # packs per thread of a row held in registers (ROW_PACKS in common.cuh)


def _opt(*arrays):
    """The arrays that are not None (for dtype checks of optional parameters)."""
    return tuple(a for a in arrays if a is not None)


def _contiguous_or_none(a):
    return None if a is None else contiguous(a)


def _halving(kernel, stride, padding) -> bool:
    """Whether a pooling is 2x2 windows at stride 2 without padding (max_pool_2x2_kernel)."""
    return tuple(kernel) == (2, 2) and tuple(stride) == (2, 2) and tuple(padding) == (0, 0)


def _exact_nearest_factors(h: int, w: int, oh: int, ow: int) -> tuple[int, int] | None:
    """(row, column) factors when nearest upsampling from (h, w) to (oh, ow) reads source
    o // factor on both axes, which nearest_up_packs_kernel assumes: the row factor a
    power of two, the column factor 1 or 2 and both axes below 2^24, where PyTorch's
    float rule floor(o * (in / out)) is exact (in / out is then 2^-k, and o a float)."""
    if oh % h or ow % w or max(oh, ow) >= 1 << 24:
        return None
    sh, sw = oh // h, ow // w
    if sh & (sh - 1) or sw not in (1, 2):
        return None
    return sh, sw


class CupyNNKernels:
    """softmax / cross-entropy / norms / pooling / upsampling / embedding backward."""

    xp: Any

    # ----- softmax family ----------------------------------------------------------
    def _softmax(self, x, log: bool, out=None):
        """softmax (log_softmax) along the last axis, into ``out`` (a contiguous array of
        x's size and dtype) when given."""
        x, rows, cols = as_rows(x)
        y = empty_as(x) if out is None else out.reshape(rows, cols)
        grid, block, tpr = row_launch(rows, cols)
        vec = cols % pack_width(x.dtype) == 0 and aligned(x, y)
        kernel(SOFTMAX, "softmax_fwd_kernel", x.dtype)(grid, block,
                                                       (x, y, rows, cols, int(log), tpr, int(vec)))
        return y

    def _softmax_grad(self, grad, y, log: bool):
        grad, rows, cols = as_rows(grad)
        y = contiguous(y)
        dx = empty_as(y)
        grid, block, tpr = row_launch(rows, cols)
        kernel(SOFTMAX, "softmax_bwd_kernel", y.dtype)(grid, block,
                                                       (grad, y, dx, rows, cols, int(log), tpr, 1.0))
        return dx

    def softmax(self, x):
        return self._softmax(x, False) if has_kernels(x) and x.ndim else super().softmax(x)

    def log_softmax(self, x):
        return self._softmax(x, True) if has_kernels(x) and x.ndim else super().log_softmax(x)

    def softmax_backward(self, grad, y):
        if not has_kernels(grad, y) or grad.shape != y.shape or not y.ndim:
            return super().softmax_backward(grad, y)
        return self._softmax_grad(grad, y, False)

    def log_softmax_backward(self, grad, y):
        if not has_kernels(grad, y) or grad.shape != y.shape or not y.ndim:
            return super().log_softmax_backward(grad, y)
        return self._softmax_grad(grad, y, True)

    def cross_entropy(self, logits, target, ignore_index, label_smoothing):
        self._check_targets("cross_entropy", logits.shape, target)
        if not has_kernels(logits):
            return super().cross_entropy(logits, target, ignore_index, label_smoothing)
        logits, rows, cols = as_rows(logits)
        target = contiguous(target.astype(numpy.int64, copy=False))
        logp = empty_as(logits)
        loss = cupy.empty(rows, dtype=logits.dtype)
        grid, block, tpr = row_launch(rows, cols)
        kernel(SOFTMAX, "cross_entropy_fwd_kernel", logits.dtype)(
            grid, block, (logits, target, logp, loss, rows, cols, int(ignore_index),
                          float(label_smoothing), tpr))
        return loss, logp

    def cross_entropy_backward(self, grad_rows, logp, target, ignore_index, label_smoothing):
        self._check_targets("cross_entropy_backward", logp.shape, target)
        if not has_kernels(logp) or grad_rows.shape != logp.shape[:1]:
            return super().cross_entropy_backward(grad_rows, logp, target, ignore_index,
                                                  label_smoothing)
        logp = contiguous(logp)
        grad_rows = contiguous(grad_rows.astype(logp.dtype, copy=False))
        target = contiguous(target.astype(numpy.int64, copy=False))
        dx = empty_as(logp)
        rows, cols = logp.shape
        launch(SOFTMAX, "cross_entropy_bwd_kernel", logp.dtype, dx.size,
               (grad_rows, logp, target, dx, rows, cols, int(ignore_index),
                float(label_smoothing)))
        return dx

    # ----- layer norm --------------------------------------------------------------
    def layer_norm(self, x, weight, bias, n_norm, eps):
        rows, cols = self._layer_rows("layer_norm", x, n_norm)
        if not has_kernels(x, *_opt(weight, bias)):
            return super().layer_norm(x, weight, bias, n_norm, eps)
        for name, p in (("weight", weight), ("bias", bias)):
            self._check_param("layer_norm", name, p, x.shape[-n_norm:])
        x = contiguous(x)
        weight = None if weight is None else contiguous(weight)
        bias = None if bias is None else contiguous(bias)
        y = empty_as(x)
        mean = cupy.empty(rows, dtype=acc_dtype(x.dtype))
        rstd = empty_as(mean)
        grid, block, tpr = row_launch(rows, cols)
        pack = pack_width(x.dtype)
        vec = cols % pack == 0 and aligned(x, y, weight, bias)
        args = (x, ptr(weight), ptr(bias), y, mean, rstd, rows, cols, float(eps), tpr)
        if vec and tpr <= 256 and cols <= tpr * pack * ROW_PACKS:
            kernel(LN, "layer_norm_fwd_cached_kernel", x.dtype)(grid, block, args)
        else:
            kernel(LN, "layer_norm_fwd_kernel", x.dtype)(grid, block, args + (int(vec),))
        return y, mean, rstd

    def layer_norm_backward(self, grad, x, weight, mean, rstd, n_norm):
        rows, cols = self._layer_rows("layer_norm_backward", x, n_norm)
        if not has_kernels(grad, x, *_opt(weight)) or grad.shape != x.shape:
            return super().layer_norm_backward(grad, x, weight, mean, rstd, n_norm)
        acc = acc_dtype(x.dtype)
        grad, x = contiguous(grad), contiguous(x)
        weight = None if weight is None else contiguous(weight)
        mean = contiguous(mean.astype(acc, copy=False))
        rstd = contiguous(rstd.astype(acc, copy=False))
        dx = empty_as(x)
        grid, block, tpr = row_launch(rows, cols)
        kernel(LN, "layer_norm_bwd_kernel", x.dtype)(
            grid, block, (grad, x, ptr(weight), mean, rstd, dx, rows, cols, tpr))
        col_blocks = -(-cols // 32)
        chunks = max(1, min(-(-rows // 64), -(-4 * loader.sm_count() // col_blocks)))
        per_chunk = -(-rows // chunks)
        dw_part = cupy.empty((chunks, cols), dtype=acc)
        db_part = empty_as(dw_part)
        kernel(LN, "layer_norm_params_kernel", x.dtype)(
            (col_blocks, chunks), (32, 8), (grad, x, mean, rstd, dw_part, db_part, rows, cols,
                                            per_chunk))
        norm_shape = x.shape[-n_norm:]
        dbias = self.reduce("sum", db_part, (0,), False).astype(x.dtype).reshape(norm_shape)
        dweight = None
        if weight is not None:
            dweight = self.reduce("sum", dw_part, (0,), False).astype(x.dtype).reshape(norm_shape)
        return dx, dweight, dbias

    # ----- group norm and batch norm (cuda/planenorm.cu) ------------------------------
    def _plane_forward(self, x, weight, bias, stat_shape: tuple, cpg: int, bn: bool,
                       eps: float, act: str, running_mean=None, running_var=None,
                       momentum: float = 0.0, use_running: bool = False, shift=None):
        """(y, mean, rstd), mean and rstd of shape ``stat_shape``; ``shift`` [N, C]
        (contiguous, GroupNorm only) is added to x first."""
        x, weight, bias = contiguous(x), _contiguous_or_none(weight), _contiguous_or_none(bias)
        n, c, s, chunks, vec = planes.geometry(x)
        acc = acc_dtype(x.dtype)
        mean, rstd = cupy.empty((2,) + stat_shape, dtype=acc)
        if not use_running:
            part = cupy.empty((n * c * chunks * 3,), dtype=acc)
            planes.stats(x, shift, part, mean, rstd, zeroed_counters(self.buffers, mean.size), cpg, bn, eps,
                         running_mean, running_var, momentum)
        y = empty_as(x)
        kernel(PLANE, "plane_apply_kernel", x.dtype)(
            (n * c, chunks), (THREADS,),
            (x, ptr(shift), ptr(weight), ptr(bias), mean, rstd, y, ptr(running_mean), ptr(running_var), s,
             chunks, c, cpg, int(bn), n, float(eps), ACT_CODES[act], int(use_running),
             int(vec and aligned(y))))
        return y, mean, rstd

    def _plane_backward(self, grad, x, weight, bias, mean, rstd, cpg: int, bn: bool,
                        act: str, frozen: bool):
        grad, x = contiguous(grad), contiguous(x)
        weight, bias = _contiguous_or_none(weight), _contiguous_or_none(bias)
        n, c, s, chunks, _ = planes.geometry(x)
        acc = acc_dtype(x.dtype)
        mean = contiguous(mean.astype(acc, copy=False)).reshape(-1)
        rstd = contiguous(rstd.astype(acc, copy=False)).reshape(-1)
        sums = cupy.empty((n * c * chunks * 2,), dtype=acc)
        geometry = (s, chunks, c, cpg, int(bn), n, ACT_CODES[act])
        kernel(PLANE, "plane_bwd_sums_kernel", x.dtype)(
            (n * c, chunks), (THREADS,), (grad, x, ptr(weight), ptr(bias), mean, rstd, sums,
                                          *geometry))
        dx = empty_as(x)
        kernel(PLANE, "plane_bwd_dx_kernel", x.dtype)(
            (n * c, chunks), (THREADS,), (grad, x, ptr(weight), ptr(bias), mean, rstd, sums, dx,
                                          *geometry, int(frozen)))
        dw = cupy.empty(c, dtype=x.dtype)
        db = cupy.empty(c, dtype=x.dtype)
        kernel(PLANE, "plane_param_grads_kernel", x.dtype)(
            (-(-c // THREADS),), (THREADS,), (sums, dw, db, n, c, chunks))
        return dx, dw, db

    def group_norm(self, x, weight, bias, groups, eps, act="none", shift=None):
        self._check_groups("group_norm", x, groups)
        check_activation("group_norm", act)
        if not has_kernels(x, *_opt(weight, bias, shift)):
            return super().group_norm(x, weight, bias, groups, eps, act, shift)
        shift = self._group_norm_params(x, weight, bias, shift)
        one_pass = one_pass_group_norm(x, weight, bias, groups, eps, act, shift)
        if one_pass is not None:
            return one_pass
        return self._plane_forward(x, weight, bias, (x.shape[0], groups), x.shape[1] // groups,
                                   False, eps, act, shift=shift)

    def _group_norm_params(self, x, weight, bias, shift):
        """Check weight and bias ([C] or None) and shift ([N, C] of x's dtype, or None)
        of a GroupNorm of x; returns shift as a contiguous [N, C] array (or None)."""
        for name, p in (("weight", weight), ("bias", bias)):
            self._check_param("group_norm", name, p, x.shape[1:2])
        if shift is None:
            return None
        return contiguous(self._shift_planes("group_norm", x, shift).reshape(x.shape[:2]))

    def group_norm_backward(self, grad, x, weight, bias, mean, rstd, groups, act="none"):
        self._check_groups("group_norm_backward", x, groups)
        check_activation("group_norm_backward", act)
        if not has_kernels(grad, x, *_opt(weight, bias)) or grad.shape != x.shape:
            return super().group_norm_backward(grad, x, weight, bias, mean, rstd, groups, act)
        dx, dw, db = self._plane_backward(grad, x, weight, bias, mean, rstd,
                                          x.shape[1] // groups, False, act, False)
        return dx, (None if weight is None else dw), (None if bias is None else db)

    def batch_norm(self, x, weight, bias, running_mean, running_var, training, momentum, eps):
        usable = has_kernels(x, *_opt(weight, bias, running_mean, running_var)) and x.ndim >= 2
        if usable:
            channels = x.shape[1]
            for name, p in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                            ("running_var", running_var)):
                self._check_param("batch_norm", name, p, (channels,))
            stats_ok = running_mean is not None and running_var is not None
            # the kernel updates running stats in place: they must be plain contiguous arrays
            if any(t is not None and not t.flags.c_contiguous for t in (running_mean, running_var)):
                usable = False
            usable = usable and (x.size // channels >= 2 if training else stats_ok)
        if not usable:
            return super().batch_norm(x, weight, bias, running_mean, running_var, training,
                                      momentum, eps)
        return self._plane_forward(x, weight, bias, (x.shape[1],), 1, True, eps, "none",
                                   running_mean, running_var, momentum, use_running=not training)

    def batch_norm_backward(self, grad, x, weight, mean, rstd, training):
        if not has_kernels(grad, x, *_opt(weight)) or grad.shape != x.shape or x.ndim < 2:
            return super().batch_norm_backward(grad, x, weight, mean, rstd, training)
        dx, dw, db = self._plane_backward(grad, x, weight, None, mean, rstd, 1, True, "none",
                                          not training)
        return dx, (None if weight is None else dw), db

    # ----- pooling -----------------------------------------------------------------
    def _pool_args(self, x_shape, out_hw, kernel_hw, stride, padding) -> tuple:
        n, c, h, w = x_shape
        return (n * c, h, w, *out_hw, *kernel_hw, *stride, *padding)

    def max_pool2d(self, x, kernel, stride, padding):
        out_hw = _pool_geometry("max_pool2d", x.shape, kernel, stride, padding)
        if not has_kernels(x):
            return super().max_pool2d(x, kernel, stride, padding)
        x = contiguous(x)
        shape = x.shape[:2] + tuple(out_hw)
        y = cupy.empty(shape, dtype=x.dtype)
        argmax = cupy.empty(shape, dtype=numpy.int64)
        h, w = x.shape[2:]
        if _halving(kernel, stride, padding) and w % 4 == 0 and x.size <= INT32_LIMIT and aligned(x):
            pairs = y.size // 2
            launch(POOL, "max_pool_2x2_kernel", x.dtype, pairs, (x, y, argmax, pairs, h, w, h // 2))
            return y, argmax
        launch(POOL, "max_pool_fwd_kernel", x.dtype, y.size,
               (x, y, argmax, *self._pool_args(x.shape, out_hw, kernel, stride, padding)))
        return y, argmax

    def max_pool2d_backward(self, grad, argmax, x_shape):
        if not has_kernels(grad) or argmax.shape != grad.shape or len(x_shape) != 4:
            return super().max_pool2d_backward(grad, argmax, x_shape)
        grad = contiguous(grad)
        argmax = contiguous(argmax.astype(numpy.int64, copy=False))
        n, c, h, w = x_shape
        dx = cupy.zeros(tuple(x_shape), dtype=grad.dtype)
        launch(POOL, "max_pool_bwd_kernel", grad.dtype, grad.size,
               (grad, argmax, dx, n * c, h * w, grad.shape[2] * grad.shape[3]))
        return dx

    def avg_pool2d(self, x, kernel, stride, padding):
        out_hw = _pool_geometry("avg_pool2d", x.shape, kernel, stride, padding)
        if not has_kernels(x):
            return super().avg_pool2d(x, kernel, stride, padding)
        x = contiguous(x)
        y = cupy.empty(x.shape[:2] + tuple(out_hw), dtype=x.dtype)
        launch(POOL, "avg_pool_fwd_kernel", x.dtype, y.size,
               (x, y, *self._pool_args(x.shape, out_hw, kernel, stride, padding)))
        return y

    def avg_pool2d_backward(self, grad, x_shape, kernel, stride, padding):
        out_hw = _pool_geometry("avg_pool2d_backward", x_shape, kernel, stride, padding)
        if not has_kernels(grad) or tuple(grad.shape[2:]) != tuple(out_hw):
            return super().avg_pool2d_backward(grad, x_shape, kernel, stride, padding)
        grad = contiguous(grad)
        dx = cupy.empty(tuple(x_shape), dtype=grad.dtype)
        launch(POOL, "avg_pool_bwd_kernel", grad.dtype, dx.size,
               (grad, dx, *self._pool_args(x_shape, out_hw, kernel, stride, padding)))
        return dx

    # ----- resampling --------------------------------------------------------------
    def upsample_nearest2d(self, x, out_hw):
        check_image("upsample_nearest2d", x.shape, out_hw)
        if not has_kernels(x):
            return super().upsample_nearest2d(x, out_hw)
        x = contiguous(x)
        n, c, h, w = x.shape
        y = cupy.empty((n, c, *out_hw), dtype=x.dtype)
        factors = _exact_nearest_factors(h, w, *out_hw)
        if (factors and w % pack_width(x.dtype) == 0 and y.size <= INT32_LIMIT
                and aligned(x)):
            out_packs = x.size // pack_width(x.dtype) * factors[1]  # packs of the output's source rows
            launch(UPSAMPLE, "nearest_up_packs_kernel", x.dtype, out_packs, (x, y, out_packs, w, *factors))
            return y
        launch(UPSAMPLE, "nearest_fwd_kernel", x.dtype, y.size, (x, y, n * c, h, w, *out_hw))
        return y

    def upsample_nearest2d_backward(self, grad, x_shape):
        check_image("upsample_nearest2d_backward", x_shape)
        if not has_kernels(grad) or grad.ndim != 4:
            return super().upsample_nearest2d_backward(grad, x_shape)
        grad = contiguous(grad)
        n, c, h, w = x_shape
        dx = cupy.empty(tuple(x_shape), dtype=grad.dtype)
        launch(UPSAMPLE, "nearest_bwd_kernel", grad.dtype, dx.size,
               (grad, dx, n * c, h, w, *grad.shape[2:]))
        return dx

    def upsample_bilinear2d(self, x, out_hw, align_corners):
        check_image("upsample_bilinear2d", x.shape, out_hw)
        if not has_kernels(x):
            return super().upsample_bilinear2d(x, out_hw, align_corners)
        x = contiguous(x)
        n, c, h, w = x.shape
        y = cupy.empty((n, c, *out_hw), dtype=x.dtype)
        launch(UPSAMPLE, "bilinear_fwd_kernel", x.dtype, y.size,
               (x, y, n * c, h, w, *out_hw, int(align_corners)))
        return y

    def upsample_bilinear2d_backward(self, grad, x_shape, align_corners):
        check_image("upsample_bilinear2d_backward", x_shape)
        if not has_kernels(grad) or grad.ndim != 4:
            return super().upsample_bilinear2d_backward(grad, x_shape, align_corners)
        grad = contiguous(grad)
        n, c, h, w = x_shape
        dx = cupy.zeros(tuple(x_shape), dtype=grad.dtype)
        launch(UPSAMPLE, "bilinear_bwd_kernel", grad.dtype, grad.size,
               (grad, dx, n * c, h, w, *grad.shape[2:], int(align_corners)))
        return dx

    # ----- embedding ---------------------------------------------------------------
    def embedding_backward(self, grad, indices, num_embeddings):
        if (not has_kernels(grad) or tuple(grad.shape[:-1]) != tuple(indices.shape)
                or not isinstance(indices, cupy.ndarray)):
            return super().embedding_backward(grad, indices, num_embeddings)
        dim = grad.shape[-1]
        grad = contiguous(grad).reshape(-1, dim)
        indices = contiguous(indices.astype(numpy.int64, copy=False)).reshape(-1)
        out = cupy.zeros((num_embeddings, dim), dtype=grad.dtype)
        launch(EMBED, "embedding_bwd_kernel", grad.dtype, grad.size,
               (grad, indices, out, grad.shape[0], dim, num_embeddings))
        return out
