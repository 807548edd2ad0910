"""Numba versions of the activation, softmax, normalisation and embedding kernels.

Each method takes the fast path when its arrays are float32/float64 of one dtype and
otherwise defers to the NumPy reference (``super()``), which also supplies the shared
argument checks, so both backends reject bad input with the same message.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from . import results
from .kernels import fast_path
from ..numpy.act import check_activation
from ..numpy.softmax import check_reduction

Array = Any

_FUSED_UNARY = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")
SMALL = 1 << 16  # elements below which a parallel kernel's start-up costs more than its work
SMALL_SUM = 1 << 12  # elements below which NumPy's reduction is as quick as a kernel call


def sum_path(op: str, a: Array, axes: Any) -> tuple[str, tuple[int, int, int]] | None:
    """How ``reduce`` computes a sum of ``a`` over ``axes`` whose kept axes are one block:
    ("channels", (outer, kept, inner)) when at least 16 summed values follow the block
    (each run summed with vector loops), ("leading", (outer, kept, 1)) when only the
    first axis of a C-contiguous array is summed (NumPy's order of additions, bit for
    bit); None otherwise (the reference's sum)."""
    if op != "sum" or axes is None or not fast_path(a) or a.ndim < 2 or a.size < SMALL_SUM:
        return None
    summed = {ax % a.ndim for ax in axes}
    kept = [ax for ax in range(a.ndim) if ax not in summed]
    if len(summed) != len(axes) or not kept or kept[-1] - kept[0] != len(kept) - 1:
        return None
    layout = (math.prod(a.shape[:kept[0]]), math.prod(a.shape[kept[0]:kept[-1] + 1]),
              math.prod(a.shape[kept[-1] + 1:]))
    if layout[2] >= 16:
        return "channels", layout
    if summed == {0} and a.flags.c_contiguous:
        return "leading", layout
    return None


def _rows(a: Array, width: int) -> Array:
    """``a`` as a C-contiguous [rows, width] array."""
    return np.ascontiguousarray(a).reshape(-1, width)


class NumbaNNKernels:
    """Activation, softmax family, layer/group/batch norm and embedding backward."""

    # ----- reductions --------------------------------------------------------------
    def reduce(self, op: str, a: Array, axes: Any, keepdims: bool) -> Array:
        """Sums that ``sum_path`` names run a kernel: the channel-sums kernel around one
        block of kept axes (an NCHW bias gradient, per-plane sums), NumPy's own additions
        jitted over the leading axis (a linear layer's bias gradient).  Everything else,
        and other reductions, the reference's."""
        path = sum_path(op, a, axes)
        if path is None:
            return super().reduce(op, a, axes, keepdims)
        kind, (outer, kept, inner) = path
        if kind == "channels":
            from .kernels.reductions import channel_sums

            sums = channel_sums(np.ascontiguousarray(a).reshape(outer, kept, inner))
        else:
            from .numpy_sums import leading_sum

            sums = np.empty(kept, dtype=a.dtype)
            leading_sum(a.reshape(outer, kept), sums)
        summed = {ax % a.ndim for ax in axes}
        shape = [1 if i in summed else n for i, n in enumerate(a.shape) if keepdims or i not in summed]
        return sums.reshape(shape)

    # ----- activations -------------------------------------------------------------
    def unary(self, op: str, a: Array) -> Array:
        if op in _FUSED_UNARY and fast_path(a):
            from .kernels import activations as K

            flat = np.ascontiguousarray(a).reshape(-1)
            return K.act_forward_flat(flat, K.ACT_CODES[op]).reshape(a.shape)
        return super().unary(op, a)

    def activation_grad(self, act: str, x: Array, grad: Array) -> Array:
        check_activation("activation_grad", act)
        if not fast_path(x, grad) or x.shape != grad.shape:
            return super().activation_grad(act, x, grad)
        from .kernels import activations as K

        flat_x = np.ascontiguousarray(x).reshape(-1)
        flat_g = np.ascontiguousarray(grad).reshape(-1)
        return K.act_backward_flat(flat_x, flat_g, K.ACT_CODES[act]).reshape(x.shape)

    def _bias_layout(self, op: str, x: Array, bias: Array, axis: int) -> tuple[int, int, int]:
        """(outer, channels, inner) of x around the bias axis, after the reference's
        checks of the bias shape and axis."""
        self._bias_along(op, x, bias, axis)
        axis %= x.ndim
        return math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:])

    def bias_act(self, x: Array, bias: Array | None, act: str, axis: int) -> Array:
        check_activation("bias_act", act)
        if bias is None or not fast_path(x, bias):
            return super().bias_act(x, bias, act, axis)
        from .kernels import activations as K

        outer, channels, inner = self._bias_layout("bias_act", x, bias, axis)
        xc, code = np.ascontiguousarray(x), K.ACT_CODES[act]
        if inner == 1:
            return K.bias_act_rows(xc.reshape(outer, channels), bias, code).reshape(x.shape)
        return K.bias_act_planes(xc.reshape(outer * channels, inner), bias, code).reshape(x.shape)

    def matmul_bias_act(self, a: Array, b: Array, bias: Array | None, act: str,
                        residual: Array | None = None, out: Array | None = None) -> Array:
        """The BLAS product, then the bias + activation kernel of ``bias_act`` run in
        place on it (into ``out`` when given), then the residual added in place: no
        array besides the product."""
        check_activation("matmul_bias_act", act)
        if residual is not None:
            total = self.binary("add", self.matmul_bias_act(a, b, bias, act, out=out), residual)
            if out is None:
                return total
            out[...] = total
            return out
        if bias is None or not fast_path(a, b, bias) or a.ndim < 2 or b.ndim < 2:
            y = super().matmul_bias_act(a, b, bias, act)
            if out is None:
                return y
            out[...] = y
            return out
        from .kernels import activations as K

        y = self.matmul(a, b, out=out)
        self._bias_layout("matmul_bias_act", y, bias, -1)
        K.bias_act_rows_(y.reshape(-1, y.shape[-1]), bias, K.ACT_CODES[act])
        return y

    def bias_act_backward(self, grad: Array, x: Array, bias: Array | None, act: str,
                          axis: int) -> tuple[Array, Array | None]:
        check_activation("bias_act_backward", act)
        if bias is None or not fast_path(grad, x, bias) or grad.shape != x.shape:
            return super().bias_act_backward(grad, x, bias, act, axis)
        from .kernels import activations as K
        from .kernels.jit import thread_count

        outer, channels, inner = self._bias_layout("bias_act_backward", x, bias, axis)
        xc, gc, code = np.ascontiguousarray(x), np.ascontiguousarray(grad), K.ACT_CODES[act]
        if inner == 1:
            gx, gb = K.bias_act_rows_backward(xc.reshape(outer, channels), bias,
                                              gc.reshape(outer, channels), code,
                                              min(thread_count(), outer))
            return gx.reshape(x.shape), gb
        gx, plane_sums = K.bias_act_planes_backward(xc.reshape(outer * channels, inner), bias,
                                                    gc.reshape(outer * channels, inner), code)
        return gx.reshape(x.shape), plane_sums.reshape(outer, channels).sum(axis=0)

    def _bind_activation(self, op: str, args: tuple, kwargs: dict, out: Array) -> Any:
        """The activation and bias + activation kernels bound to their arrays (after the
        checks ``unary``/``bias_act`` make on every call), or None for other calls."""
        from .kernels import activations as K

        if op == "unary" and not kwargs and args[0] in _FUSED_UNARY and fast_path(args[1]) \
                and args[1].flags.c_contiguous and out is not None and out.flags.c_contiguous:
            flat_out, run = out.reshape(-1), K.act_forward_flat.bind(args[1].reshape(-1), K.ACT_CODES[args[0]])
            return lambda: np.copyto(flat_out, run())
        if op == "bias_act" and not kwargs and args[1] is not None and fast_path(args[0], args[1]) \
                and args[0].flags.c_contiguous and out is not None and out.flags.c_contiguous:
            x, bias, act, axis = args
            check_activation("bias_act", act)
            if act == "none" and x.size <= SMALL:  # a broadcast add, exact either way: NumPy's is cheaper to call
                return functools.partial(np.add, x, self._bias_along("bias_act", x, bias, axis), out=out)
            outer, channels, inner = self._bias_layout("bias_act", x, bias, axis)
            rows, kernel = (channels, K.bias_act_rows) if inner == 1 else (inner, K.bias_act_planes)
            out2, run = out.reshape(-1, rows), kernel.bind(x.reshape(-1, rows), bias, K.ACT_CODES[act])
            return lambda: np.copyto(out2, run())
        return None

    # ----- softmax family ----------------------------------------------------------
    def softmax(self, x: Array) -> Array:
        if not fast_path(x) or x.ndim == 0 or x.size == 0:
            return super().softmax(x)
        from .kernels import softmax as K

        return K.softmax_rows(_rows(x, x.shape[-1])).reshape(x.shape)

    def softmax_backward(self, grad: Array, y: Array) -> Array:
        if not fast_path(grad, y) or grad.shape != y.shape or y.ndim == 0 or y.size == 0:
            return super().softmax_backward(grad, y)
        from .kernels import softmax as K

        width = y.shape[-1]
        return K.softmax_rows_backward(_rows(grad, width), _rows(y, width)).reshape(y.shape)

    def log_softmax(self, x: Array) -> Array:
        if not fast_path(x) or x.ndim == 0 or x.size == 0:
            return super().log_softmax(x)
        from .kernels import softmax as K

        return K.log_softmax_rows(_rows(x, x.shape[-1])).reshape(x.shape)

    def log_softmax_backward(self, grad: Array, y: Array) -> Array:
        if not fast_path(grad, y) or grad.shape != y.shape or y.ndim == 0 or y.size == 0:
            return super().log_softmax_backward(grad, y)
        from .kernels import softmax as K

        width = y.shape[-1]
        return K.log_softmax_rows_backward(_rows(grad, width), _rows(y, width)).reshape(y.shape)

    def _checked_targets(self, op: str, shape: tuple, target: Array, ignore_index: int) -> Array:
        """target as contiguous int64 after the reference's checks, plus a range check
        (the kernels index with it)."""
        self._check_targets(op, shape, target)
        target = np.ascontiguousarray(target, dtype=np.int64)
        self._check_target_range(op, shape[1], target, ignore_index)
        return target

    def cross_entropy(self, logits: Array, target: Array, ignore_index: int,
                      label_smoothing: float) -> tuple[Array, Array]:
        if not fast_path(logits) or logits.ndim != 2 or logits.shape[0] == 0:
            return super().cross_entropy(logits, target, ignore_index, label_smoothing)
        from .kernels import softmax as K

        target = self._checked_targets("cross_entropy", logits.shape, target, ignore_index)
        return K.cross_entropy_rows(np.ascontiguousarray(logits), target, ignore_index,
                                    float(label_smoothing))

    def cross_entropy_backward(self, grad_rows: Array, logp: Array, target: Array,
                               ignore_index: int, label_smoothing: float) -> Array:
        if (not fast_path(grad_rows, logp) or logp.ndim != 2 or logp.shape[0] == 0
                or grad_rows.shape != logp.shape[:1]):
            return super().cross_entropy_backward(grad_rows, logp, target, ignore_index,
                                                  label_smoothing)
        from .kernels import softmax as K

        target = self._checked_targets("cross_entropy_backward", logp.shape, target, ignore_index)
        return K.cross_entropy_rows_backward(np.ascontiguousarray(grad_rows),
                                             np.ascontiguousarray(logp), target,
                                             ignore_index, float(label_smoothing))

    def cross_entropy_reduced(self, logits: Array, target: Array, ignore_index: int,
                              label_smoothing: float, reduction: str
                              ) -> tuple[Array, Array, Array]:
        if not fast_path(logits) or logits.ndim != 2 or logits.shape[0] == 0:
            return super().cross_entropy_reduced(logits, target, ignore_index, label_smoothing,
                                                 reduction)
        from .kernels import softmax as K

        op = "cross_entropy_reduced"
        check_reduction(op, reduction)
        self._check_targets(op, logits.shape, target)
        target = np.ascontiguousarray(target, dtype=np.int64)
        logp, total, kept, bad = K.cross_entropy_total(np.ascontiguousarray(logits), target,
                                                       ignore_index, float(label_smoothing))
        if bad >= 0:
            self._check_target_range(op, logits.shape[1], target, ignore_index)  # raises
        divisor = float(kept) if reduction == "mean" else 1.0
        loss = total / divisor if divisor else math.nan
        return np.array(loss, dtype=logits.dtype), logp, np.array(divisor)

    def cross_entropy_reduced_backward(self, grad: Array, logp: Array, target: Array,
                                       ignore_index: int, label_smoothing: float,
                                       divisor: Array) -> Array:
        if (not fast_path(grad, logp) or logp.ndim != 2 or logp.shape[0] == 0
                or grad.ndim != 0 or not isinstance(divisor, np.ndarray)):
            return super().cross_entropy_reduced_backward(grad, logp, target, ignore_index,
                                                          label_smoothing, divisor)
        from .kernels import softmax as K

        op = "cross_entropy_reduced_backward"
        self._check_targets(op, logp.shape, target)
        target = np.ascontiguousarray(target, dtype=np.int64)
        d = float(divisor)
        dx, bad = K.cross_entropy_total_backward(float(grad) / d if d else math.inf,
                                                 np.ascontiguousarray(logp), target,
                                                 ignore_index, float(label_smoothing))
        if bad >= 0:
            self._check_target_range(op, logp.shape[1], target, ignore_index)  # raises
        return dx

    # ----- normalisation -----------------------------------------------------------
    @staticmethod
    def _affine_params(weight: Array | None, bias: Array | None, size: int,
                       dtype: Any) -> tuple[Array, Array]:
        """Flat weight and bias, ones / zeros standing in for a missing one."""
        w = np.ones(size, dtype) if weight is None else np.ascontiguousarray(weight).reshape(size)
        b = np.zeros(size, dtype) if bias is None else np.ascontiguousarray(bias).reshape(size)
        return w, b

    def layer_norm(self, x: Array, weight: Array | None, bias: Array | None,
                   n_norm: int, eps: float) -> tuple[Array, Array, Array]:
        if not fast_path(x, weight, bias) or x.size == 0:
            return super().layer_norm(x, weight, bias, n_norm, eps)
        from .kernels import norms as K

        _, feats = self._layer_rows("layer_norm", x, n_norm)
        for name, p in (("weight", weight), ("bias", bias)):
            self._check_param("layer_norm", name, p, x.shape[-n_norm:])
        w, b = self._affine_params(weight, bias, feats, x.dtype)
        y, mean, rstd = K.layer_norm_rows(_rows(x, feats), w, b, float(eps))
        return y.reshape(x.shape), mean, rstd

    def layer_norm_backward(self, grad: Array, x: Array, weight: Array | None,
                            mean: Array, rstd: Array, n_norm: int
                            ) -> tuple[Array, Array | None, Array | None]:
        if not fast_path(grad, x, weight, mean, rstd) or x.size == 0 or grad.shape != x.shape:
            return super().layer_norm_backward(grad, x, weight, mean, rstd, n_norm)
        from .kernels import norms as K
        from .kernels.jit import thread_count

        rows, feats = self._layer_rows("layer_norm_backward", x, n_norm)
        w, _ = self._affine_params(weight, None, feats, x.dtype)
        dx, dw, db = K.layer_norm_rows_backward(
            _rows(grad, feats), _rows(x, feats), w, np.ascontiguousarray(mean).reshape(rows),
            np.ascontiguousarray(rstd).reshape(rows), min(thread_count(), rows))
        norm_shape = x.shape[-n_norm:]
        return (dx.reshape(x.shape), None if weight is None else dw.reshape(norm_shape),
                db.reshape(norm_shape))

    def _group_blocks(self, op: str, x: Array, groups: int) -> Array:
        """x [N, C, *] as a contiguous [N, groups, C/groups, prod(*)] array."""
        self._check_groups(op, x, groups)
        n, c = x.shape[:2]
        return np.ascontiguousarray(x).reshape(n, groups, c // groups, math.prod(x.shape[2:]))

    def group_norm(self, x: Array, weight: Array | None, bias: Array | None,
                   groups: int, eps: float, act: str = "none", shift: Array | None = None,
                   out: tuple | None = None) -> tuple[Array, Array, Array]:
        """The reference's group norm; ``out`` (y, mean, rstd) as ``results.py`` takes it."""
        check_activation("group_norm", act)
        if not fast_path(x, weight, bias, shift) or x.size == 0:
            return results.deliver_all("group_norm", out,
                                       super().group_norm(x, weight, bias, groups, eps, act, shift))
        from .kernels import activations, norms as K

        blocks = self._group_blocks("group_norm", x, groups)
        for name, p in (("weight", weight), ("bias", bias)):
            self._check_param("group_norm", name, p, x.shape[1:2])
        if shift is not None:
            shift = np.ascontiguousarray(self._shift_planes("group_norm", x, shift)).reshape(x.shape[:2])
        w, b = self._affine_params(weight, bias, x.shape[1], x.dtype)
        given = results.items("group_norm", out, 3)
        shapes = (x.shape, blocks.shape[:2], blocks.shape[:2])
        for g, shape in zip(given, shapes):
            results.check("group_norm", g, shape, x.dtype)
        y, mean, rstd = (results.target(g, shape, x.dtype) for g, shape in zip(given, shapes))
        K.group_norm_groups(blocks, w, b, float(eps), activations.ACT_CODES[act], shift,
                            y.reshape(blocks.shape), mean, rstd)
        return tuple(results.deliver(g, r) for g, r in zip(given, (y, mean, rstd)))

    def group_norm_backward(self, grad: Array, x: Array, weight: Array | None,
                            bias: Array | None, mean: Array, rstd: Array, groups: int,
                            act: str = "none", out: tuple | None = None
                            ) -> tuple[Array, Array | None, Array | None]:
        """The reference's group norm backward; ``out`` (dx, dweight, dbias) as
        ``results.py`` takes it (an item for a missing weight or bias is left alone)."""
        check_activation("group_norm_backward", act)
        if (not fast_path(grad, x, weight, bias, mean, rstd) or x.size == 0
                or grad.shape != x.shape):
            return results.deliver_all("group_norm_backward", out, super().group_norm_backward(
                grad, x, weight, bias, mean, rstd, groups, act))
        from .kernels import activations, norms as K

        blocks = self._group_blocks("group_norm_backward", x, groups)
        w, b = self._affine_params(weight, bias, x.shape[1], x.dtype)
        given = results.items("group_norm_backward", out, 3)
        if weight is None or bias is None:  # no result there: the kernel's sums go to scratch
            given = (given[0], given[1] if weight is not None else None, given[2] if bias is not None else None)
        shapes = (x.shape, (x.shape[1],), (x.shape[1],))
        for g, shape in zip(given, shapes):
            results.check("group_norm_backward", g, shape, x.dtype)
        dx, dw, db = (results.target(g, shape, x.dtype) for g, shape in zip(given, shapes))
        K.group_norm_groups_backward(
            np.ascontiguousarray(grad).reshape(blocks.shape), blocks, w, b,
            np.ascontiguousarray(mean).reshape(blocks.shape[:2]),
            np.ascontiguousarray(rstd).reshape(blocks.shape[:2]), activations.ACT_CODES[act],
            dx.reshape(blocks.shape), dw, db)
        dx, dw, db = (results.deliver(g, r) for g, r in zip(given, (dx, dw, db)))
        return dx, None if weight is None else dw, None if bias is None else db

    def batch_norm(self, x: Array, weight: Array | None, bias: Array | None,
                   running_mean: Array | None, running_var: Array | None,
                   training: bool, momentum: float, eps: float
                   ) -> tuple[Array, Array, Array]:
        count = x.size // x.shape[1] if x.ndim >= 2 and x.shape[1] else 0
        usable = fast_path(x, weight, bias) and x.ndim >= 2 and (count >= 2 or not training)
        if not usable or (not training and (running_mean is None or running_var is None)):
            return super().batch_norm(x, weight, bias, running_mean, running_var, training,
                                      momentum, eps)
        from .kernels import norms as K

        channels = x.shape[1]
        for name, p in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                        ("running_var", running_var)):
            self._check_param("batch_norm", name, p, (channels,))
        planes = np.ascontiguousarray(x).reshape(x.shape[0], channels, -1)
        if training:
            mean, var = self._batch_moments(planes)
            self._update_running_stats(running_mean, running_var, mean, var, count, momentum)
        else:
            mean, var = running_mean.astype(np.float64), running_var.astype(np.float64)
        rstd = 1.0 / np.sqrt(var + eps)
        w, b = self._affine_params(weight, bias, channels, np.float64)
        scale = (w * rstd).astype(x.dtype)
        shift = (b - mean * w * rstd).astype(x.dtype)
        y = K.plane_affine(planes, scale, shift)
        return y.reshape(x.shape), mean.astype(x.dtype), rstd.astype(x.dtype)

    @staticmethod
    def _batch_moments(planes: Array) -> tuple[Array, Array]:
        """Per-channel (mean, biased variance) in float64 of planes [N, C, S]: plane
        moments merged over N with the equal-count form of Chan's update."""
        from .kernels import norms as K

        plane_mean, plane_m2 = K.plane_moments(planes)
        n, size = planes.shape[0], planes.shape[2]
        mean = plane_mean.mean(axis=0)
        m2 = plane_m2.sum(axis=0) + size * ((plane_mean - mean) ** 2).sum(axis=0)
        return mean, m2 / (n * size)

    def batch_norm_backward(self, grad: Array, x: Array, weight: Array | None,
                            mean: Array, rstd: Array, training: bool
                            ) -> tuple[Array, Array | None, Array | None]:
        if not fast_path(grad, x, weight, mean, rstd) or x.ndim < 2 or grad.shape != x.shape:
            return super().batch_norm_backward(grad, x, weight, mean, rstd, training)
        from .kernels import norms as K

        channels = x.shape[1]
        planes = np.ascontiguousarray(x).reshape(x.shape[0], channels, -1)
        gplanes = np.ascontiguousarray(grad).reshape(planes.shape)
        sum_g, sum_gx = K.plane_sums(gplanes, planes, np.ascontiguousarray(mean))
        sum_g = sum_g.sum(axis=0, dtype=np.float64)
        sum_gxhat = sum_gx.sum(axis=0, dtype=np.float64) * rstd
        w, _ = self._affine_params(weight, None, channels, np.float64)
        k = w * rstd  # dx = k * (g - mean(g) - xhat * mean(g * xhat)) when training
        if training:
            count = planes.shape[0] * planes.shape[2]
            x_scale = -k * rstd * sum_gxhat / count
            shift = -k * sum_g / count - x_scale * mean
        else:
            x_scale, shift = np.zeros(channels), np.zeros(channels)
        dx = K.plane_affine2(gplanes, planes, k.astype(x.dtype), x_scale.astype(x.dtype),
                             shift.astype(x.dtype))
        dweight = None if weight is None else sum_gxhat.astype(x.dtype)
        return dx.reshape(x.shape), dweight, sum_g.astype(x.dtype)

    # ----- embedding ---------------------------------------------------------------
    def embedding_backward(self, grad: Array, indices: Array, num_embeddings: int) -> Array:
        if not fast_path(grad) or grad.ndim == 0 or indices.size == 0:
            return super().embedding_backward(grad, indices, num_embeddings)
        from .kernels import embedding as K

        if tuple(grad.shape[:-1]) != tuple(indices.shape):
            raise ValueError(f"embedding_backward: grad of shape {grad.shape} does not "
                             f"match indices of shape {indices.shape} plus a feature axis")
        flat = np.asarray(indices, dtype=np.int64).reshape(-1)
        if flat.min() < 0 or flat.max() >= num_embeddings:
            raise ValueError(f"embedding_backward: indices must lie in [0, {num_embeddings}),"
                             f" got values from {flat.min()} to {flat.max()}")
        order = np.argsort(flat, kind="stable")
        ordered = flat[order]
        starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
        return K.scatter_rows(_rows(grad, grad.shape[-1]), order, ordered, starts,
                              num_embeddings)
