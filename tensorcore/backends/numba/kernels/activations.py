"""Activation functions and their derivatives, plus the fused bias+activation loops.

Kernels take the activation as an ``ACT_CODES`` value (the codes of
``backends/opcodes.py``, which the CUDA kernels take too), which Numba types as a
literal: a compile-time constant.  A kernel is therefore compiled once per activation
it is called with, and each compiled version holds that activation's loop only; one
version holding all seven loops would cost seven times the compile time of the ones a
run uses (most use one or two).  ``act_value`` / ``act_derivative`` (one value) and
``act_row`` / ``act_grad_row`` (a row) require that constant.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.core import errors
from numba.extending import overload, typeof_impl
from numba.np.numpy_support import as_dtype

from ... import opcodes
from .jit import JIT_OPTIONS, helper, kernel
from .lanes import SUM, lane_sum
from .mathfn import fexp, fnormcdf, ftanh
from .parallel import parallel_for
from .reductions import column_sums


class ActivationCode(int):
    """An activation code as the kernels take it: Numba types it as a literal."""

    __slots__ = ()


# made once: making a literal type takes ~6 us, which every kernel call would pay
_LITERAL_TYPES = {code: types.literal(code) for code in opcodes.ACT_CODES.values()}


@typeof_impl.register(ActivationCode)
def _typeof_activation_code(value, context):
    return _LITERAL_TYPES[value]


ACT_CODES = {name: ActivationCode(code) for name, code in opcodes.ACT_CODES.items()}
# the codes as plain ints, which jitted code reads as compile-time constants
_NONE = int(opcodes.Act.NONE)
_RELU = int(opcodes.Act.RELU)
_GELU = int(opcodes.Act.GELU)
_GELU_TANH = int(opcodes.Act.GELU_TANH)
_SILU = int(opcodes.Act.SILU)
_SIGMOID = int(opcodes.Act.SIGMOID)
_TANH = int(opcodes.Act.TANH)

_INV_SQRT_2PI = 0.3989422804014327
_GELU_TANH_K = 0.7978845608028654  # sqrt(2 / pi)
_GELU_TANH_C = 0.044715


def _constant_code(name, code):
    """The activation that ``code`` (the type of a kernel's code argument) names, or a
    typing error naming ``name`` when it is not a compile-time constant."""
    if not isinstance(code, types.IntegerLiteral) or code.literal_value not in opcodes.ACT_CODES.values():
        raise errors.TypingError(f"{name}: the activation code must be a compile-time constant, one of "
                                 f"{sorted(opcodes.ACT_CODES.values())} (pass an ACT_CODES value), got {code}")
    return code.literal_value


def act_value(code, v):
    """act(v) for the activation ``code``, in the dtype of ``v``; callable from jitted
    code only (the ``overload`` below is the implementation)."""


def act_derivative(code, v):
    """d act(v) / dv for the activation ``code``, in the dtype of ``v``; callable from jitted
    code only (the ``overload`` below is the implementation)."""


@overload(act_value, prefer_literal=True, inline="always", jit_options=JIT_OPTIONS)
def _act_value_impl(code, v):
    act = _constant_code("act_value", code)
    t = as_dtype(v).type  # constants in v's dtype keep float32 math in float32
    if act == _NONE:
        return lambda code, v: v
    if act == _RELU:
        return lambda code, v: max(v, t(0.0))
    if act == _GELU:
        return lambda code, v: v * fnormcdf(v)
    if act == _GELU_TANH:
        def gelu_tanh(code, v):  # 0.5 v (1 + tanh(u)) = v sigmoid(2u), free of cancellation
            u = t(_GELU_TANH_K) * (v + t(_GELU_TANH_C) * v * v * v)
            return v / (t(1.0) + fexp(t(-2.0) * u))
        return gelu_tanh
    if act == _SILU:
        return lambda code, v: v / (t(1.0) + fexp(-v))
    if act == _SIGMOID:
        return lambda code, v: t(1.0) / (t(1.0) + fexp(-v))
    return lambda code, v: ftanh(v)  # _TANH, the last code


def _sigmoid_and_slope(z):
    """(sigmoid(z), sigmoid'(z)); callable from jitted code only (see the overload)."""


@overload(_sigmoid_and_slope, jit_options=JIT_OPTIONS)
def _sigmoid_and_slope_impl(z):
    t = as_dtype(z).type

    def impl(z):
        # With e = exp(-|z|) both tails are free of cancellation: sigmoid(z) is
        # 1/(1+e) or e/(1+e), and sigmoid' = sigmoid(z) sigmoid(-z) = e / (1+e)².
        e = fexp(-abs(z))
        inv = t(1.0) / (t(1.0) + e)
        s = inv if z >= t(0.0) else e * inv
        return s, e * inv * inv

    return impl


@overload(act_derivative, prefer_literal=True, inline="always", jit_options=JIT_OPTIONS)
def _act_derivative_impl(code, v):
    act = _constant_code("act_derivative", code)
    t = as_dtype(v).type
    if act == _NONE:
        return lambda code, v: t(1.0)
    if act == _RELU:
        return lambda code, v: t(v > t(0.0))
    if act == _GELU:
        return lambda code, v: fnormcdf(v) + v * t(_INV_SQRT_2PI) * fexp(t(-0.5) * v * v)
    if act == _GELU_TANH:
        def gelu_tanh(code, v):  # d/dv [v sigmoid(2u)] = sigmoid(2u) + 2 v sigmoid'(2u) du/dv
            u = t(_GELU_TANH_K) * (v + t(_GELU_TANH_C) * v * v * v)
            s, ds = _sigmoid_and_slope(t(2.0) * u)
            du = t(_GELU_TANH_K) * (t(1.0) + t(3.0 * _GELU_TANH_C) * v * v)
            return s + t(2.0) * v * ds * du
        return gelu_tanh
    if act == _SILU:
        def silu(code, v):
            s, ds = _sigmoid_and_slope(v)
            return s + v * ds
        return silu
    if act == _SIGMOID:
        return lambda code, v: _sigmoid_and_slope(v)[1]

    def tanh(code, v):  # _TANH, the last code
        th = ftanh(v)
        return t(1.0) - th * th
    return tanh


def _at(a, i):
    """a[i] for an array, ``a`` itself for a scalar; callable from jitted code only."""


@overload(_at, inline="always", jit_options=JIT_OPTIONS)
def _at_impl(a, i):
    if isinstance(a, types.Array):
        return lambda a, i: a[i]
    return lambda a, i: a


def _target(src, dst):
    """``dst``, or ``src`` when ``dst`` is None; callable from jitted code only."""


@overload(_target, inline="always", jit_options=JIT_OPTIONS)
def _target_impl(src, dst):
    if isinstance(dst, types.NoneType):
        return lambda src, dst: src
    return lambda src, dst: dst


def act_row(code, src, scale, shift, dst):
    """dst[:] = act(src * scale + shift), ``shift`` a scalar or a row like ``src``;
    ``dst`` None writes into ``src``.  Callable from jitted code only (the overload
    below), with the code a compile-time constant, so the loop vectorises (a loop that
    branches on a run-time code per element does not).

    The bias or affine step is part of the loop, so callers need not store a
    pre-activation and activate it in place: LLVM compiles an in-place
    ``row[i] = max(row[i], 0)`` to masked stores, several times slower than plain ones
    on AMD CPUs.  A ``dst`` that is ``src`` under another name takes the scalar loop
    (LLVM's overlap check fails), hence None for in place."""


def act_grad_row(code, src, scale, shift, grad, dst):
    """dst[:] = grad * act'(src * scale + shift), arguments as in ``act_row``."""


@overload(act_row, prefer_literal=True, inline="always", jit_options=JIT_OPTIONS)
def _act_row_impl(code, src, scale, shift, dst):
    _constant_code("act_row", code)

    def impl(code, src, scale, shift, dst):
        out = _target(src, dst)
        for i in range(src.size):
            out[i] = act_value(code, src[i] * scale + _at(shift, i))

    return impl


@overload(act_grad_row, prefer_literal=True, inline="always", jit_options=JIT_OPTIONS)
def _act_grad_row_impl(code, src, scale, shift, grad, dst):
    _constant_code("act_grad_row", code)

    def impl(code, src, scale, shift, grad, dst):
        out = _target(src, dst)
        for i in range(src.size):
            out[i] = grad[i] * act_derivative(code, src[i] * scale + _at(shift, i))

    return impl


_BLOCK = 8192


@helper
def _act_block(k, x, code, out):
    t = x.dtype.type
    lo, hi = k * _BLOCK, min((k + 1) * _BLOCK, x.size)
    act_row(code, x[lo:hi], t(1.0), t(0.0), out[lo:hi])


@kernel
def act_forward_flat(x, code):
    """act(x) over a contiguous 1-D array, in parallel blocks."""
    out = np.empty_like(x)
    parallel_for(_act_block, (x.size + _BLOCK - 1) // _BLOCK, (x, code, out))
    return out


@helper
def _act_grad_block(k, x, grad, code, out):
    t = x.dtype.type
    lo, hi = k * _BLOCK, min((k + 1) * _BLOCK, x.size)
    act_grad_row(code, x[lo:hi], t(1.0), t(0.0), grad[lo:hi], out[lo:hi])


@kernel
def act_backward_flat(x, grad, code):
    """act'(x) * grad over contiguous 1-D arrays, in parallel blocks."""
    out = np.empty_like(x)
    parallel_for(_act_grad_block, (x.size + _BLOCK - 1) // _BLOCK, (x, grad, code, out))
    return out


@helper
def _bias_act_row(r, x, bias, code, out):
    t = x.dtype.type
    act_row(code, x[r], t(1.0), bias, out[r])


@kernel
def bias_act_rows(x, bias, code):
    """act(x + bias) for x [R, C] with bias [C] along the last axis."""
    out = np.empty_like(x)
    parallel_for(_bias_act_row, x.shape[0], (x, bias, code, out))
    return out


@helper
def _bias_act_row_(r, x, bias, code):
    t = x.dtype.type
    act_row(code, x[r], t(1.0), bias, None)


@kernel
def bias_act_rows_(x, bias, code):
    """x[:] = act(x + bias) in place, for x [R, C] with bias [C] along the last axis."""
    parallel_for(_bias_act_row_, x.shape[0], (x, bias, code))


@helper
def _bias_act_chunk_backward(k, x, bias, grad, code, rows, cols, chunks, out, partial):
    """d/dx of chunk ``k``'s rows, and their d bias sum into row ``k`` of ``partial``."""
    t = x.dtype.type
    acc = partial[k]
    for r in range(k * rows // chunks, (k + 1) * rows // chunks):
        res = out[r]
        act_grad_row(code, x[r], t(1.0), bias, grad[r], res)
        for c in range(cols):
            acc[c] += res[c]


@kernel
def bias_act_rows_backward(x, bias, grad, code, chunks):
    """(d/dx, d/dbias) of ``bias_act_rows``; rows are split into ``chunks`` blocks
    that each sum their own share of d bias."""
    rows, cols = x.shape
    out = np.empty_like(x)
    partial = np.zeros((chunks, cols), dtype=x.dtype)
    parallel_for(_bias_act_chunk_backward, chunks, (x, bias, grad, code, rows, cols, chunks, out, partial))
    return out, column_sums(partial)


@helper
def _bias_act_plane(p, x, bias, code, channels, out):
    t = x.dtype.type
    act_row(code, x[p], t(1.0), bias[p % channels], out[p])


@kernel
def bias_act_planes(x, bias, code):
    """act(x + bias) for x [P, S] (the planes of a [outer, C, S] array) with plane p
    shifted by bias[p % C]."""
    channels = bias.shape[0]
    out = np.empty_like(x)
    parallel_for(_bias_act_plane, x.shape[0], (x, bias, code, channels, out))
    return out


@helper
def _bias_act_plane_backward(p, x, bias, grad, code, channels, out, plane_sums):
    t = x.dtype.type
    res = out[p]
    act_grad_row(code, x[p], t(1.0), bias[p % channels], grad[p], res)
    plane_sums[p] = lane_sum(SUM, res, res, t(0.0))


@kernel
def bias_act_planes_backward(x, bias, grad, code):
    """d/dx of ``bias_act_planes`` and the per-plane sums of it ([P], for d bias)."""
    channels = bias.shape[0]
    out = np.empty_like(x)
    plane_sums = np.empty(x.shape[0], dtype=x.dtype)
    parallel_for(_bias_act_plane_backward, x.shape[0], (x, bias, grad, code, channels, out, plane_sums))
    return out, plane_sums
