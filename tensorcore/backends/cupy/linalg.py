"""CuPy overrides for GEMM-based ops: matmul, conv2d (+ both gradients) as implicit
GEMM on the tensor cores (``cupy/conv_igemm.py``) with im2col + GEMM as the fallback,
and attention as GEMM + fused masked softmax + GEMM.

Every GEMM goes through ``cublas.gemm`` (our own cuBLAS handle), so all of these can
be captured in a CUDA graph.  TF32 is used for float32 when the matmul precision
setting is "high"; 16-bit inputs accumulate in float32.
"""

from __future__ import annotations

import math
from typing import Any

import cupy
import numpy

from . import cublas
from . import conv_igemm, conv_norm, flash_attention, flash_attention_bwd
from .loader import THREADS, kernel, launch
from ..numpy.act import check_activation
from .elementwise import ACT_CODES
from .util import (INT32_LIMIT, aligned, contiguous, empty_as, has_kernels, pack_width, ptr,
                   row_launch)

CONV = "im2col.cu"
SOFTMAX = "softmax.cu"
LINEAR_ROWS = "linear_rows.cu"
MAX_ROWS = 8  # rows of a the few-rows product takes (MAX_ROWS in linear_rows.cu)
GROUP_MAX = 32  # products per grouped launch (GROUP_MAX in linear_rows.cu)
# linear_rows.cu's LinearRowsGroup: six arrays of GROUP_MAX 8-byte words, one more first_block
_GROUP_TABLE = numpy.dtype([("words", numpy.int64, (6 * GROUP_MAX + 1,))])


def allow_tf32() -> bool:
    """Whether float32 GEMMs may use TF32 (matmul precision "high")."""
    from ... import settings

    return getattr(settings, "get_matmul_precision", lambda: "highest")() == "high"


def _operand(x) -> tuple[Any, bool, int]:
    """(array, stored transposed?, leading dimension) for the last two axes of x."""
    rows, cols = x.shape[-2:]
    if x.flags.c_contiguous:
        return x, False, max(1, cols)
    if x.swapaxes(-1, -2).flags.c_contiguous:
        return x, True, max(1, rows)
    return contiguous(x), False, max(1, cols)


def bmm(a, b, out, trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0,
        beta: float = 0.0) -> None:
    """out[i] = alpha * op(a[i]) @ op(b[i]) + beta * out[i] for contiguous 3-D a, b,
    out (a batch of 1 broadcasts); op transposes a stored matrix when asked."""
    m, n = out.shape[-2:]
    k = a.shape[-2] if trans_a else a.shape[-1]
    batch = out.shape[0]
    cublas.gemm(trans_a, trans_b, m, n, k,
                a.data.ptr, max(1, a.shape[-1]), 0 if a.shape[0] == 1 else a[0].size,
                b.data.ptr, max(1, b.shape[-1]), 0 if b.shape[0] == 1 else b[0].size,
                out.data.ptr, max(1, n), m * n, batch, out.dtype, alpha, beta, allow_tf32())


def _few_rows(a, b) -> bool:
    """Whether ``a @ b`` is a product of at most MAX_ROWS rows with the transpose of a
    row-major weight that linear_rows.cu takes: a [M, K] and b.T [N, K] C-contiguous, one
    dtype, K whole packs, 16-byte aligned."""
    return (a.ndim == 2 and b.ndim == 2 and 0 < a.shape[0] <= MAX_ROWS and b.shape[1] > 0
            and a.dtype == b.dtype and a.shape[1] % pack_width(a.dtype) == 0 and a.shape[1] > 0
            and a.flags.c_contiguous and b.T.flags.c_contiguous and aligned(a, b))


def _rows_kernel_takes(a, b, bias) -> bool:
    """Whether linear_rows.cu computes ``act(a @ b + bias)``: ``_few_rows``, kernels for
    the dtype, and a bias (if any) of b's column count in a's dtype."""
    return (_few_rows(a, b) and has_kernels(a, b, *(() if bias is None else (bias,)))
            and (bias is None or bias.shape == b.shape[1:]))


def _linear_rows(a, b, bias, act: str):
    """act(a @ b + bias) by linear_rows.cu (see ``_few_rows``); bias [N] or None."""
    (m, k), n = a.shape, b.shape[1]
    y = cupy.empty((m, n), dtype=a.dtype)
    bias = None if bias is None else contiguous(bias)
    warps = THREADS // 32
    kernel(LINEAR_ROWS, "linear_rows_kernel", a.dtype)(
        (-(-n // warps),), (THREADS,), (a, b.T, ptr(bias), y, m, n, k, ACT_CODES[act]))
    return y


def _linear_rows_group(a, products: list) -> list:
    """``_linear_rows`` of each (b, bias, act) in ``products`` (all taken by the kernel),
    GROUP_MAX products per launch: each launch gets a table of the products' operands
    (``LinearRowsGroup`` in linear_rows.cu, passed by value).  A bias copied to make it
    contiguous is held until the launch that reads it: freed sooner, its block could be
    handed to a later bias copy or result of the same launch."""
    (m, k), warps = a.shape, THREADS // 32
    results = []
    for start in range(0, len(products), GROUP_MAX):
        chunk = products[start:start + GROUP_MAX]
        biases = [None if bias is None else contiguous(bias) for _, bias, _ in chunk]
        table = numpy.zeros(6 * GROUP_MAX + 1, numpy.int64)
        columns = table[:6 * GROUP_MAX].reshape(6, GROUP_MAX)  # w, bias, y, n, act, first_block
        first = 0
        for i, ((b, _, act), bias) in enumerate(zip(chunk, biases)):
            n = b.shape[1]
            y = cupy.empty((m, n), dtype=a.dtype)
            columns[:, i] = (b.data.ptr, 0 if bias is None else bias.data.ptr, y.data.ptr, n, ACT_CODES[act], first)
            first += -(-n // warps)
            results.append(y)
        table[5 * GROUP_MAX + len(chunk)] = first
        kernel(LINEAR_ROWS, "linear_rows_group_kernel", a.dtype)(
            (first,), (THREADS,), (a, table.view(_GROUP_TABLE), len(chunk), m, k))
    return results


class CupyLinalgKernels:
    """matmul, conv2d and its gradients, attention."""

    xp: Any

    # ----- matmul ------------------------------------------------------------------
    def matmul(self, a, b):
        if (not has_kernels(a, b) or not cublas.supports(a.dtype) or a.ndim == 0 or b.ndim == 0
                or a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]):
            return super().matmul(a, b)
        if _few_rows(a, b):
            return _linear_rows(a, b, None, "none")
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        batch = numpy.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        (m, k), n = a2.shape[-2:], b2.shape[-1]
        nb = math.prod(batch)
        out = cupy.empty(batch + (m, n), dtype=a.dtype)
        if out.size == 0 or k == 0:
            return super().matmul(a, b)
        ops = []
        for x in (a2, b2):
            if x.shape[:-2] != batch and math.prod(x.shape[:-2]) != 1:
                x = contiguous(cupy.broadcast_to(x, batch + x.shape[-2:]))
            x, trans, ld = _operand(x)
            stride = 0 if math.prod(x.shape[:-2]) == 1 else x.shape[-2] * x.shape[-1]
            ops.append((x, trans, ld, stride))
        (xa, ta, lda, sa), (xb, tb, ldb, sb) = ops
        cublas.gemm(ta, tb, m, n, k, xa.data.ptr, lda, sa, xb.data.ptr, ldb, sb,
                    out.data.ptr, n, m * n, nb, a.dtype, allow_tf32=allow_tf32())
        if a.ndim == 1:
            out = out[..., 0, :]
        if b.ndim == 1:
            out = out[..., 0]
        return out

    def matmul_bias_act(self, a, b, bias, act: str, residual=None):
        """A product of few rows (``_few_rows``) in one kernel with the bias and the
        activation; otherwise the cuBLAS product, then ``bias_act``'s kernel run in place
        on the product's buffer, adding the residual in the same pass.  Either way the
        eager calls' arithmetic without their intermediate arrays."""
        check_activation("matmul_bias_act", act)
        if _rows_kernel_takes(a, b, bias):
            y = _linear_rows(a, b, bias, act)
            return y if residual is None else self.binary("add", y, residual)
        y = self.matmul(a, b)
        arrays = [x for x in (bias, residual) if x is not None]
        if y.ndim == 0 or not has_kernels(y, *arrays) or not y.flags.c_contiguous \
                or (residual is not None and (residual.shape != y.shape or residual.dtype != y.dtype)):
            y = self.bias_act(y, bias, act, -1)
            return y if residual is None else self.binary("add", y, residual)
        residual = None if residual is None else contiguous(residual)
        return self._affine_act_into("matmul_bias_act", y, None, bias, act, -1, y, residual)

    def matmul_bias_act_group(self, a, products):
        """Every product linear_rows.cu takes in one launch per GROUP_MAX of them (each
        column computed as ``matmul_bias_act`` computes it), the others one by one."""
        products = self._group_products(products)
        takes = [_rows_kernel_takes(a, b, bias) for b, bias, _ in products]
        if sum(takes) < 2:
            return tuple(self.matmul_bias_act(a, *p) for p in products)
        grouped = iter(_linear_rows_group(a, [p for p, t in zip(products, takes) if t]))
        return tuple(next(grouped) if t else self.matmul_bias_act(a, *p) for p, t in zip(products, takes))

    # ----- convolution -------------------------------------------------------------
    def _conv_ok(self, x_shape, w_shape, *arrays) -> bool:
        """Kernels and cuBLAS cover the dtype, and the im2col / col2im thread counts
        (N * C * max(H*W, Ho*Wo), bounded by the padded image) fit 32-bit indices."""
        n, c, h, w = (tuple(x_shape) + (1, 1, 1, 1))[:4]
        kh, kw = (tuple(w_shape) + (1, 1, 1, 1))[2:4]
        padded = n * c * (h + 2 * kh) * (w + 2 * kw)
        return (has_kernels(*arrays) and cublas.supports(arrays[0].dtype)
                and padded <= INT32_LIMIT)

    @staticmethod
    def _is_pointwise(w_shape, stride, padding, dilation) -> bool:
        return tuple(w_shape[2:]) == (1, 1) and tuple(stride) == (1, 1) and \
            tuple(padding) == (0, 0) and tuple(dilation) == (1, 1)

    def _as_gemm(self, x_shape, w_shape, stride, padding, dilation, groups, *arrays) -> bool:
        """Whether a convolution goes to cuBLAS rather than the implicit-GEMM kernels: a
        1x1 convolution of one group is one plain GEMM per image, reading NCHW as it
        lies, where the kernels would first repack the whole input to NHWC."""
        return groups == 1 and self._is_pointwise(w_shape, stride, padding, dilation) and \
            self._conv_ok(x_shape, w_shape, *arrays)

    def _im2col_gpu(self, x, w_shape, out_hw, stride, padding, dilation):
        """col [N, Cin*kh*kw, Ho*Wo] of contiguous x (x itself for a 1x1 conv)."""
        n, c, h, w = x.shape
        kh, kw = w_shape[2:]
        if self._is_pointwise(w_shape, stride, padding, dilation):
            return x.reshape(n, c, h * w)
        ho, wo = out_hw
        col = cupy.empty((n, c * kh * kw, ho * wo), dtype=x.dtype)
        launch(CONV, "im2col_kernel", x.dtype, n * c * ho * wo,
               (x, col, n, c, h, w, kh, kw, *stride, *padding, *dilation, ho, wo))
        return col

    def conv2d(self, x, w, stride, padding, dilation, groups, bias=None, act="none",
               residual=None, residual_scale=1.0, out=None):
        ho, wo = self._conv_geometry("conv2d", x.shape, w.shape, stride, padding, dilation, groups)
        self._check_epilogue("conv2d", (x.shape[0], w.shape[0], ho, wo), bias, act, residual)
        self._check_out("conv2d", out, (x.shape[0], w.shape[0], ho, wo), x.dtype)
        fused = _epilogue_in_kernel(x, bias, residual)
        kernel_epilogue = (bias, act, residual, residual_scale) if fused else ()
        y = None
        if not self._as_gemm(x.shape, w.shape, stride, padding, dilation, groups, x, w):
            y = conv_igemm.forward(x, w, (ho, wo), stride, padding, dilation, groups,
                                   *kernel_epilogue, out=out if fused else None)
        if y is None:
            y = self._conv2d_gemm(x, w, (ho, wo), stride, padding, dilation, groups)
        elif fused:
            return y
        return self._into(out, self._conv_epilogue(y, bias, act, residual, residual_scale))

    def group_norm_conv2d(self, x, norm, w, stride, padding, dilation, groups, bias=None,
                          act="none", residual=None, residual_scale=1.0, out=None):
        """The GroupNorm applied inside the implicit-GEMM pack (``conv_norm``) where the
        kernels cover the call; else GroupNorm, then conv2d."""
        fused = self._group_norm_in(x, norm, w, stride, padding, dilation, groups, bias, residual)
        if fused is not None:
            ho, wo = self._conv_geometry("group_norm_conv2d", x.shape, w.shape, stride, padding,
                                         dilation, groups)
            self._check_epilogue("group_norm_conv2d", (x.shape[0], w.shape[0], ho, wo), bias,
                                 act, residual)
            self._check_out("group_norm_conv2d", out, (x.shape[0], w.shape[0], ho, wo), x.dtype)
            y = conv_igemm.forward(x, w, (ho, wo), stride, padding, dilation, groups, bias, act,
                                   residual, residual_scale, norm=fused, out=out)
            if y is not None:
                return y
        return super().group_norm_conv2d(x, norm, w, stride, padding, dilation, groups, bias,
                                         act, residual, residual_scale, out=out)

    def upsample_conv2d(self, x, out_hw, w, stride, padding, dilation, groups, bias=None,
                        act="none", residual=None, residual_scale=1.0, out=None):
        """A 2x upsampling into a 3x3 convolution (stride 1, padding 1, one group) as one
        stride-2 transposed convolution of the small image (``conv_igemm.upsample_forward``)
        where the kernels cover the call; else the upsampling, then conv2d."""
        self._check_upsample_conv(x, out_hw, w, stride, padding, dilation, groups, bias, act, residual, out)
        doubled = tuple(out_hw) == (2 * x.shape[2], 2 * x.shape[3]) and tuple(w.shape[2:]) == (3, 3) \
            and (tuple(stride), tuple(padding), tuple(dilation), groups) == ((1, 1), (1, 1), (1, 1), 1)
        if doubled and _epilogue_in_kernel(x, bias, residual):
            y = conv_igemm.upsample_forward(x, w, bias, act, residual, residual_scale, out=out)
            if y is not None:
                return y
        return super().upsample_conv2d(x, out_hw, w, stride, padding, dilation, groups, bias, act,
                                       residual, residual_scale, out=out)

    def _group_norm_in(self, x, norm, w, stride, padding, dilation, groups, bias=None, residual=None):
        """``norm`` as a conv_norm.GroupNormIn when the pack can apply it (CuPy arrays of
        one dtype, the epilogue's included, valid GroupNorm arguments, a convolution of
        one group that the implicit GEMM runs, x laid out for the statistics), else None."""
        if not isinstance(norm, tuple) or len(norm) != 6:
            return None
        weight, nbias, ngroups, eps, nact, shift = norm
        arrays = [a for a in (weight, nbias, shift, bias, residual) if a is not None]
        if not has_kernels(x, w, *arrays) or x.ndim != 4 or w.ndim != 4 or groups != 1 \
                or self._as_gemm(x.shape, w.shape, stride, padding, dilation, groups, x, w):
            return None
        self._check_groups("group_norm", x, ngroups)
        check_activation("group_norm", nact)
        shift = self._group_norm_params(x, weight, nbias, shift)
        return conv_norm.covered(x, conv_norm.GroupNormIn(weight, nbias, ngroups, eps, nact, shift))

    def _conv2d_gemm(self, x, w, out_hw, stride, padding, dilation, groups):
        """conv2d as im2col + cuBLAS GEMM (or the xp reference where cuBLAS can't)."""
        if not self._conv_ok(x.shape, w.shape, x, w):
            return super().conv2d(x, w, stride, padding, dilation, groups)
        ho, wo = out_hw
        w = contiguous(w)
        n, cout = x.shape[0], w.shape[0]
        if groups == 1 and self._is_pointwise(w.shape, stride, padding, dilation) and _channels_last(x):
            # tokens seen as an image ([B, H·W, C] transposed to [B, C, H, W]): each image
            # is the transpose of a row-major [H·W, C] matrix, which cuBLAS reads as it lies
            c = x.shape[1]
            out = cupy.empty((n, cout, ho, wo), dtype=x.dtype)
            _gemm(False, True, cout, ho * wo, c, (w, 0, c, 0), (x, 0, c, ho * wo * c),
                  (out, 0, ho * wo, cout * ho * wo), n)
            return out
        x = contiguous(x)
        col = self._im2col_gpu(x, w.shape, (ho, wo), stride, padding, dilation)
        out = cupy.empty((n, cout, ho, wo), dtype=x.dtype)
        big_k, ohw = col.shape[1:]
        kg, cog = big_k // groups, cout // groups
        for g in range(groups):  # out_g[i] = w_g @ col_g[i]
            _gemm(False, False, cog, ohw, kg, (w, g * cog * kg, kg, 0),
                  (col, g * kg * ohw, ohw, big_k * ohw), (out, g * cog * ohw, ohw, cout * ohw), n)
        return out

    def conv2d_grad_input(self, grad, w, x_shape, stride, padding, dilation, groups):
        ho, wo = self._conv_grad_geometry("conv2d_grad_input", grad, x_shape, w.shape, stride,
                                          padding, dilation, groups)
        dx = None
        if not self._as_gemm(x_shape, w.shape, stride, padding, dilation, groups, grad, w):
            dx = conv_igemm.input_grad(grad, w, x_shape, stride, padding, dilation, groups)
        if dx is not None:
            return dx
        if not self._conv_ok(x_shape, w.shape, grad, w):
            return super().conv2d_grad_input(grad, w, x_shape, stride, padding, dilation, groups)
        n, c, h, wd = x_shape
        cout, kh, kw = w.shape[0], w.shape[2], w.shape[3]
        grad, w = contiguous(grad), contiguous(w)
        pointwise = self._is_pointwise(w.shape, stride, padding, dilation)
        dx = cupy.empty(tuple(x_shape), dtype=grad.dtype)
        big_k, ohw = c * kh * kw, ho * wo
        col = dx.reshape(n, c, h * wd) if pointwise else cupy.empty((n, big_k, ohw), grad.dtype)
        kg, cog = big_k // groups, cout // groups
        for g in range(groups):  # col_g[i] = w_gᵀ @ grad_g[i]
            _gemm(True, False, kg, ohw, cog, (w, g * cog * kg, kg, 0),
                  (grad, g * cog * ohw, ohw, cout * ohw), (col, g * kg * ohw, ohw, big_k * ohw), n)
        if not pointwise:
            launch(CONV, "col2im_kernel", dx.dtype, dx.size,
                   (col, dx, n, c, h, wd, kh, kw, *stride, *padding, *dilation, ho, wo))
        return dx

    def conv2d_grad_weight(self, grad, x, w_shape, stride, padding, dilation, groups):
        ho, wo = self._conv_grad_geometry("conv2d_grad_weight", grad, x.shape, w_shape, stride,
                                          padding, dilation, groups)
        dw = None
        if not self._as_gemm(x.shape, w_shape, stride, padding, dilation, groups, grad, x):
            dw = conv_igemm.weight_grad(grad, x, w_shape, stride, padding, dilation, groups)
        if dw is not None:
            return dw
        if not self._conv_ok(x.shape, w_shape, grad, x):
            return super().conv2d_grad_weight(grad, x, w_shape, stride, padding, dilation, groups)
        n, cout = x.shape[0], w_shape[0]
        grad, x = contiguous(grad), contiguous(x)
        col = self._im2col_gpu(x, w_shape, (ho, wo), stride, padding, dilation)
        big_k, ohw = col.shape[1:]
        kg, cog = big_k // groups, cout // groups
        per_image = cupy.empty((n, cout, kg), dtype=x.dtype)
        for g in range(groups):  # dw_g[i] = grad_g[i] @ col_g[i]ᵀ
            _gemm(False, True, cog, kg, ohw, (grad, g * cog * ohw, ohw, cout * ohw),
                  (col, g * kg * ohw, ohw, big_k * ohw), (per_image, g * cog * kg, kg, cout * kg), n)
        dw = per_image[0] if n == 1 else self.reduce("sum", per_image, (0,), False)
        return dw.reshape(tuple(w_shape))

    # ----- attention ---------------------------------------------------------------
    def attention(self, q, k, v, mask, causal, scale):
        fits = (q.ndim == k.ndim == v.ndim == 4 and q.shape[:2] == k.shape[:2] == v.shape[:2]
                and q.shape[3] == k.shape[3] and k.shape[2] == v.shape[2])
        if not (fits and has_kernels(q, k, v) and cublas.supports(q.dtype)):
            return super().attention(q, k, v, mask, causal, scale)
        b, h, lq, d = q.shape
        lk, dv = k.shape[2], v.shape[3]
        q3, k3, v3 = (contiguous(t).reshape(b * h, t.shape[2], t.shape[3]) for t in (q, k, v))
        scores = cupy.empty((b * h, lq, lk), dtype=q.dtype)
        bmm(q3, k3, scores, trans_b=True, alpha=scale)
        if mask is None and not causal:  # the plain row softmax, rows cached in registers
            probs = cupy.empty((b, h, lq, lk), dtype=q.dtype)  # allocated 4-D, as the reference's
            self._softmax(scores, False, out=probs)
        else:
            probs = self._masked_probs(scores, mask, causal, (b, h, lq, lk))
        out = cupy.empty((b, h, lq, dv), dtype=q.dtype)
        bmm(probs.reshape(b * h, lq, lk), v3, out.reshape(b * h, lq, dv))
        return out, probs

    def attention_output(self, q, k, v, mask, causal, scale):
        if _flash(q, k, v, None, scale) and (mask is None or flash_attention.mask_fits(mask, q, k)):
            return flash_attention.forward(q, k, v, causal, scale, mask=mask)
        return self.attention(q, k, v, mask, causal, scale)[0]

    def attention_lse(self, q, k, v, mask, causal, scale):
        if _flash(q, k, v, mask, scale):
            return flash_attention.forward(q, k, v, causal, scale, with_lse=True)
        return None

    def attention_lse_backward(self, grad, q, k, v, out, lse, causal, scale):
        if has_kernels(grad, q) and _flash(q, k, v, None, scale):  # grad of q's dtype too
            return flash_attention_bwd.backward(grad, q, k, v, out, lse, causal, scale)
        return super().attention_lse_backward(grad, q, k, v, out, lse, causal, scale)

    def _masked_probs(self, scores, mask, causal: bool, shape: tuple[int, int, int, int]):
        """softmax(scores + mask) over the last axis, j > i hidden when ``causal``: the
        probabilities, allocated 4-D (as the reference's)."""
        b, h, lq, lk = shape
        strides = (0, 0, 0, 0)
        if mask is not None:
            mask = cupy.broadcast_to(mask.astype(scores.dtype, copy=False), shape)
            strides = tuple(s // mask.itemsize for s in mask.strides)
        probs = cupy.empty(shape, dtype=scores.dtype)
        grid, block, tpr = row_launch(b * h * lq, lk)
        kernel(SOFTMAX, "attn_softmax_kernel", scores.dtype)(
            grid, block, (scores, ptr(mask), probs, b * h * lq, lk, h, lq, int(causal),
                          *strides, tpr))
        return probs

    def attention_backward(self, grad, q, k, v, probs, scale):
        if not (has_kernels(grad, q, k, v, probs) and cublas.supports(q.dtype) and q.ndim == 4):
            return super().attention_backward(grad, q, k, v, probs, scale)
        b, h, lq, d = q.shape
        lk, dv = k.shape[2], v.shape[3]
        g3, q3, k3, v3, p3 = (contiguous(t).reshape(b * h, t.shape[2], t.shape[3])
                              for t in (grad, q, k, v, probs))
        dv_ = cupy.empty((b * h, lk, dv), dtype=q.dtype)
        bmm(p3, g3, dv_, trans_a=True)
        dprobs = cupy.empty((b * h, lq, lk), dtype=q.dtype)
        bmm(g3, v3, dprobs, trans_b=True)
        dscores = empty_as(dprobs)
        grid, block, tpr = row_launch(b * h * lq, lk)
        kernel(SOFTMAX, "softmax_bwd_kernel", q.dtype)(
            grid, block, (dprobs, p3, dscores, b * h * lq, lk, 0, tpr, float(scale)))
        dq = cupy.empty((b * h, lq, d), dtype=q.dtype)
        bmm(dscores, k3, dq)
        dk = cupy.empty((b * h, lk, d), dtype=q.dtype)
        bmm(dscores, q3, dk, trans_a=True)
        return dq.reshape(q.shape), dk.reshape(k.shape), dv_.reshape(v.shape)


def _epilogue_in_kernel(x, bias, residual) -> bool:
    """Whether the implicit-GEMM kernels apply this epilogue: they fuse a bias and a
    residual of x's own dtype; others are added after."""
    return all(a is None or (type(a) is cupy.ndarray and a.dtype == x.dtype) for a in (bias, residual))


def _flash(q, k, v, mask, scale: float) -> bool:
    """Whether flash attention computes this call (no additive mask, scale > 0)."""
    return mask is None and scale > 0 and has_kernels(q, k, v) and flash_attention.fits(q, k, v)


def _channels_last(x) -> bool:
    """Whether 4-D x is a dense NHWC array seen as NCHW (and not also C-contiguous)."""
    return x.ndim == 4 and not x.flags.c_contiguous and x.transpose(0, 2, 3, 1).flags.c_contiguous \
        and x.data.ptr % 16 == 0


def _gemm(trans_a: bool, trans_b: bool, m: int, n: int, k: int, a: tuple, b: tuple,
          c: tuple, batch: int) -> None:
    """Strided-batched GEMM on sub-blocks: each operand is (array, element offset,
    leading dimension, batch stride in elements)."""
    item = c[0].dtype.itemsize
    (xa, oa, lda, sa), (xb, ob, ldb, sb), (xc, oc, ldc, sc) = a, b, c
    cublas.gemm(trans_a, trans_b, m, n, k, xa.data.ptr + oa * item, lda, sa,
                xb.data.ptr + ob * item, ldb, sb, xc.data.ptr + oc * item, ldc, sc, batch,
                xc.dtype, allow_tf32=allow_tf32())
