"""CuPy overrides for elementwise ops, fused activations and reductions (RawKernels
in cuda/elementwise.cu and cuda/reduce.cu).  Anything the kernels do not cover
(integer dtypes, mixed dtypes, prod/any/all, odd layouts) goes to the xp reference."""

from __future__ import annotations

import math
from typing import Any

import cupy
import numpy

from . import loader
from .loader import grid_for, kernel, launch
from .. import opcodes
from ..numpy.act import check_activation
from .util import (acc_dtype, aligned, contiguous, empty_as, has_kernels, pack_width,
                   ptr, row_launch)

EW = "elementwise.cu"
RED = "reduce.cu"
UNARY_OPS = opcodes.UNARY_CODES
BINARY_OPS = opcodes.BINARY_CODES
ACT_CODES = opcodes.ACT_CODES
REDUCE_OPS = opcodes.REDUCTION_CODES


def _packed_work(n: int, vec: bool, dtype: Any) -> int:
    """Threads' work items: whole packs plus the tail elements, or single elements."""
    if not vec:
        return n
    width = 16 // dtype.itemsize  # dtype is an array's numpy dtype here
    return n // width + n % width


def _collapse(shape: tuple, *strides: tuple) -> tuple[list, list]:
    """Drop size-1 dims and merge neighbours that are contiguous in every stride set."""
    dims = [(s, [st[i] for st in strides]) for i, s in enumerate(shape) if s != 1]
    merged: list = []
    for size, st in dims:
        if merged and all(p == q * size for p, q in zip(merged[-1][1], st)):
            merged[-1] = (merged[-1][0] * size, st)
        else:
            merged.append((size, st))
    return [m[0] for m in merged], [[m[1][k] for m in merged] for k in range(len(strides))]


class CupyElementwiseKernels:
    """unary / binary / activations / bias_act / reduce on RawKernels."""

    xp: Any

    # ----- elementwise -------------------------------------------------------------
    def unary(self, op: str, a):
        if op not in UNARY_OPS or not has_kernels(a):
            return super().unary(op, a)
        a = contiguous(a)
        out = empty_as(a)
        vec = aligned(a, out)
        launch(EW, "unary_kernel", a.dtype, _packed_work(a.size, vec, a.dtype),
               (a, out, a.size, UNARY_OPS[op], int(vec)))
        return out

    def gated_activation(self, x, act: str, bias=None):
        if act not in ACT_CODES or act == "none" or x.shape[-1] % 2 \
                or not has_kernels(x, *(() if bias is None else (bias,))) \
                or (bias is not None and (bias.shape != x.shape[-1:] or bias.dtype != x.dtype)):
            return super().gated_activation(x, act, bias)
        x = contiguous(x)
        bias = None if bias is None else contiguous(bias)
        half = x.shape[-1] // 2
        out = cupy.empty(x.shape[:-1] + (half,), dtype=x.dtype)
        vec = half % pack_width(x.dtype) == 0 and aligned(x, out, *(() if bias is None else (bias,)))
        rows = out.size // half if half else 0
        work = out.size // pack_width(x.dtype) if vec else out.size
        launch(EW, "glu_kernel", x.dtype, work, (x, ptr(bias), out, rows, half, ACT_CODES[act], int(vec)))
        return out

    def binary(self, op: str, a, b):
        code = BINARY_OPS.get(op)
        if code is None or not has_kernels(a, b):
            return super().binary(op, a, b)
        same_shape = a.shape == b.shape
        shape = a.shape if same_shape else numpy.broadcast_shapes(a.shape, b.shape)
        out = cupy.ndarray(shape, a.dtype)
        n, strides = out.size, out.strides
        # strides equal to a fresh array's mean C-contiguous (reading ``flags`` builds an
        # object per call: the host time of a tiny op is what this path is about)
        if same_shape and a.strides == strides and b.strides == strides:
            if aligned(a, b):  # out comes from the memory pool: always aligned
                launch(EW, "binary_vec_kernel", a.dtype, _packed_work(n, True, a.dtype),
                       (a, b, out, n, code))
            else:
                launch(EW, "binary_kernel", a.dtype, n, (a, b, out, n, code, 1, 1))
            return out
        if b.size == 1 and a.shape == shape and a.flags.c_contiguous:
            launch(EW, "binary_kernel", a.dtype, n, (a, b, out, n, code, 1, 0))
            return out
        if a.size == 1 and b.shape == shape and b.flags.c_contiguous:
            launch(EW, "binary_kernel", a.dtype, n, (a, b, out, n, code, 0, 1))
            return out
        if (self._binary_channel(code, a, b, out, False)
                or self._binary_channel(code, b, a, out, True)):
            return out
        ab, bb = cupy.broadcast_to(a, shape), cupy.broadcast_to(b, shape)
        item = a.dtype.itemsize
        dims, (sa, sb) = _collapse(shape, tuple(s // item for s in ab.strides),
                                   tuple(s // item for s in bb.strides))
        if len(dims) > 4:
            return super().binary(op, a, b)
        pad = 4 - len(dims)
        dims, sa, sb = [1] * pad + dims, [0] * pad + sa, [0] * pad + sb
        launch(EW, "binary_bcast_kernel", a.dtype, n,
               (a, b, out, code, dims[1], dims[2], dims[3], n, *sa, *sb))
        return out

    def _binary_channel(self, code: int, x, v, out, v_first: bool) -> bool:
        """out = op(x, v) (op(v, x) with ``v_first``) on binary_channel_kernel when x is
        C-contiguous with out's shape and v broadcasts to one contiguous value per channel
        of out viewed as [outer, C, inner]; False, writing nothing, otherwise."""
        if x.shape != out.shape or x.strides != out.strides:
            return False
        item = v.dtype.itemsize
        pad = out.ndim - v.ndim
        strides = [0] * pad + [st // item if size != 1 else 0 for size, st in zip(v.shape, v.strides)]
        dims, (sv,) = _collapse(out.shape, tuple(strides))
        moving = [k for k, st in enumerate(sv) if st]
        if len(moving) != 1 or sv[moving[0]] != 1:
            return False
        k = moving[0]
        inner = math.prod(dims[k + 1:])
        vec = inner % pack_width(x.dtype) == 0 and aligned(x)
        launch(EW, "binary_channel_kernel", x.dtype, _packed_work(out.size, vec, x.dtype),
               (x, v, out, out.size, dims[k], inner, code, int(v_first), int(vec)))
        return True

    # ----- fused activations -------------------------------------------------------
    def _channel_view(self, op: str, x, vec_arrays: tuple, per_channel: Any, axis: int
                      ) -> tuple[int, int, bool]:
        """(C, inner, vec) for x viewed as [outer, C, inner] around ``axis``."""
        if per_channel is None:
            return 1, 1, aligned(*vec_arrays)
        self._bias_along(op, x, per_channel, axis)  # validates, raises on mismatch
        axis %= x.ndim
        inner = math.prod(x.shape[axis + 1:])
        vec = inner % pack_width(x.dtype) == 0 and aligned(*vec_arrays)
        return x.shape[axis], inner, vec

    def affine_act(self, x, scale, bias, act: str, axis: int):
        """act(x * scale + bias) with 1-D scale / bias (either may be None) along
        ``axis`` of x, in one pass over x."""
        check_activation("affine_act", act)
        params = [p for p in (scale, bias) if p is not None]
        if not has_kernels(x, *params) or (scale is not None and bias is not None
                                           and scale.shape != bias.shape):
            y = x if scale is None else x * self._bias_along("affine_act", x, scale, axis)
            return self.bias_act(y, bias, act, axis)
        return self._affine_act_into("affine_act", contiguous(x), scale, bias, act, axis, None)

    def _affine_act_into(self, op: str, x, scale, bias, act: str, axis: int, out, residual=None):
        """affine_act_kernel on C-contiguous x, into ``out`` (a new array when None; x
        itself is fine: each element is read before it is written, by the same thread),
        plus a C-contiguous ``residual`` of x's shape and dtype when given; ``op`` names
        the caller in errors."""
        scale = None if scale is None else contiguous(scale)
        bias = None if bias is None else contiguous(bias)
        out = empty_as(x) if out is None else out
        channel = scale if scale is not None else bias
        dense = (x, out) if residual is None else (x, out, residual)
        C, inner, vec = self._channel_view(op, x, dense, channel, axis)
        launch(EW, "affine_act_kernel", x.dtype, _packed_work(x.size, vec, x.dtype),
               (x, ptr(scale), ptr(bias), ptr(residual), out, x.size, C, inner, ACT_CODES[act], int(vec)))
        return out

    def bias_act(self, x, bias, act: str, axis: int):
        check_activation("bias_act", act)
        if not has_kernels(x, *(() if bias is None else (bias,))):
            return super().bias_act(x, bias, act, axis)
        return self.affine_act(x, None, bias, act, axis)

    def _act_grad(self, op: str, grad, x, bias, act: str, axis: int):
        x, grad = contiguous(x), contiguous(grad)
        bias = None if bias is None else contiguous(bias)
        out = empty_as(x)
        C, inner, vec = self._channel_view(op, x, (x, grad, out), bias, axis)
        launch(EW, "bias_act_grad_kernel", x.dtype, _packed_work(x.size, vec, x.dtype),
               (grad, x, ptr(bias), out, x.size, C, inner, ACT_CODES[act], int(vec)))
        return out

    def activation_grad(self, act: str, x, grad):
        check_activation("activation_grad", act)
        if not has_kernels(x, grad) or x.shape != grad.shape:
            return super().activation_grad(act, x, grad)
        return self._act_grad("activation_grad", grad, x, None, act, 0)

    def bias_act_backward(self, grad, x, bias, act: str, axis: int):
        check_activation("bias_act_backward", act)
        arrays = (x, grad) if bias is None else (x, grad, bias)
        if not has_kernels(*arrays) or x.shape != grad.shape:
            return super().bias_act_backward(grad, x, bias, act, axis)
        dx = self._act_grad("bias_act_backward", grad, x, bias, act, axis)
        if bias is None:
            return dx, None
        axis %= x.ndim
        other = tuple(i for i in range(x.ndim) if i != axis)
        return dx, self.reduce("sum", dx, other, False)

    # ----- reductions --------------------------------------------------------------
    def reduce(self, op: str, a, axes, keepdims: bool):
        ndim = a.ndim if isinstance(a, cupy.ndarray) else 0
        wanted = tuple(range(ndim)) if axes is None else (
            (axes,) if isinstance(axes, int) else tuple(axes))
        if (op not in REDUCE_OPS or ndim == 0 or not has_kernels(a)
                or any(not -ndim <= ax < ndim for ax in wanted)):
            return super().reduce(op, a, axes, keepdims)
        axes = tuple(sorted({ax % ndim for ax in wanted}))
        out_shape = tuple(1 if i in axes else s for i, s in enumerate(a.shape)) if keepdims \
            else tuple(s for i, s in enumerate(a.shape) if i not in axes)
        groups: list[list] = []  # [size, reduced] after dropping size-1 dims
        for i, s in enumerate(a.shape):
            if s == 1:
                continue
            red = i in axes
            if groups and groups[-1][1] == red:
                groups[-1][0] *= s
            else:
                groups.append([s, red])
        a = contiguous(a)
        pattern = "".join("R" if red else "K" for _, red in groups)
        sizes = [s for s, _ in groups]
        code = REDUCE_OPS[op]
        if "R" not in pattern:
            return a.reshape(out_shape).copy()
        if pattern == "R":
            return self._reduce_flat(a, code).reshape(out_shape)
        if pattern == "KR":
            return self._reduce_rows(a, sizes[0], sizes[1], code).reshape(out_shape)
        if pattern == "RK":
            return self._reduce_cols(a, sizes[0], sizes[1], code).reshape(out_shape)
        if pattern == "RKR":
            out = cupy.empty(sizes[1], dtype=a.dtype)
            kernel(RED, "reduce_mid_kernel", a.dtype)((sizes[1],), (256,),
                                                      (a, out, sizes[0], sizes[1], sizes[2], code))
            return out.reshape(out_shape)
        return super().reduce(op, a, axes, keepdims)

    def _reduce_rows(self, a, rows: int, cols: int, code: int):
        out = cupy.empty(rows, dtype=a.dtype)
        grid, block, tpr = row_launch(rows, cols)
        kernel(RED, "reduce_rows_kernel", a.dtype)(grid, block, (a, out, rows, cols, code, tpr))
        return out

    def _reduce_flat(self, a, code: int):
        n = a.size
        blocks = grid_for(n)
        partial = cupy.empty(blocks, dtype=acc_dtype(a.dtype))
        kernel(RED, "reduce_flat_kernel", a.dtype)((blocks,), (256,), (a, partial, n, code))
        out = cupy.empty(1, dtype=a.dtype)
        kernel(RED, "reduce_partials_kernel", a.dtype)((1,), (256,),
                                                       (partial, out, 1, blocks, code, 256))
        return out

    def _reduce_cols(self, a, rows: int, cols: int, code: int):
        col_blocks = -(-cols // 32)
        chunks = max(1, min(-(-rows // 8), -(-4 * loader.sm_count() // col_blocks)))
        per_chunk = -(-rows // chunks)
        acc = acc_dtype(a.dtype)
        partial = cupy.empty((chunks, cols), dtype=acc)
        kernel(RED, "reduce_cols_kernel", a.dtype)((col_blocks, chunks), (32, 8),
                                                   (a, partial, rows, cols, per_chunk, code))
        if chunks > 1:
            total = cupy.empty((1, cols), dtype=acc)
            kernel(RED, "reduce_cols_kernel", acc)((col_blocks, 1), (32, 8),
                                                   (partial, total, chunks, cols, chunks, code))
            partial = total
        return partial.reshape(cols).astype(a.dtype, copy=False)

