"""Activation functions and their derivatives, plus the fused bias+activation loops.

Activations are passed to kernels as small integer codes (``ACT_CODES``, from
``backends/opcodes.py``) so one
compiled kernel serves every activation; ``act_row`` / ``act_grad_row`` branch on
the code once per row and run a loop specialised to that activation.
"""

from __future__ import annotations

import numpy as np
from numba import prange, types
from numba.extending import overload
from numba.np.numpy_support import as_dtype

from ... import opcodes
from .jit import JIT_OPTIONS, helper, inlined, kernel
from .mathfn import fexp, fnormcdf, ftanh

ACT_CODES = opcodes.ACT_CODES  # the codes the CUDA kernels take too
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


def act_value(code, v):
    """act(v) for the activation ``code``, in the dtype of ``v``; callable from jitted
    code only (the ``overload`` below is the implementation)."""


def act_derivative(code, v):
    """d act(v) / dv for the activation ``code``, in the dtype of ``v``; callable from jitted
    code only (the ``overload`` below is the implementation)."""


@overload(act_value, inline="always", jit_options=JIT_OPTIONS)
def _act_value_impl(code, v):
    t = as_dtype(v).type  # constants in v's dtype keep float32 math in float32

    def impl(code, v):
        if code == _RELU:
            return max(v, t(0.0))
        if code == _GELU:
            return v * fnormcdf(v)
        if code == _GELU_TANH:  # 0.5 v (1 + tanh(u)) = v sigmoid(2u), free of cancellation
            u = t(_GELU_TANH_K) * (v + t(_GELU_TANH_C) * v * v * v)
            return v / (t(1.0) + fexp(t(-2.0) * u))
        if code == _SILU:
            return v / (t(1.0) + fexp(-v))
        if code == _SIGMOID:
            return t(1.0) / (t(1.0) + fexp(-v))
        if code == _TANH:
            return ftanh(v)
        return v

    return impl


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


@overload(act_derivative, inline="always", jit_options=JIT_OPTIONS)
def _act_derivative_impl(code, v):
    t = as_dtype(v).type

    def impl(code, v):
        if code == _RELU:
            return t(v > t(0.0))
        if code == _GELU:
            return fnormcdf(v) + v * t(_INV_SQRT_2PI) * fexp(t(-0.5) * v * v)
        if code == _GELU_TANH:  # d/dv [v sigmoid(2u)] = sigmoid(2u) + 2 v sigmoid'(2u) du/dv
            u = t(_GELU_TANH_K) * (v + t(_GELU_TANH_C) * v * v * v)
            s, ds = _sigmoid_and_slope(t(2.0) * u)
            du = t(_GELU_TANH_K) * (t(1.0) + t(3.0 * _GELU_TANH_C) * v * v)
            return s + t(2.0) * v * ds * du
        if code == _SILU:
            s, ds = _sigmoid_and_slope(v)
            return s + v * ds
        if code == _SIGMOID:
            return _sigmoid_and_slope(v)[1]
        if code == _TANH:
            th = ftanh(v)
            return t(1.0) - th * th
        return t(1.0)

    return impl


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


@inlined
def act_row(code, src, scale, shift, dst):
    """dst[:] = act(src * scale + shift), ``shift`` a scalar or a row like ``src``;
    ``dst`` None writes into ``src``.

    One loop per activation with the code as a constant, so every loop vectorises (a
    loop that branches on a run-time code per element does not).  The bias or affine
    step is part of the loop, so callers need not store a pre-activation and activate
    it in place: LLVM compiles an in-place ``row[i] = max(row[i], 0)`` to masked
    stores, several times slower than plain ones on AMD CPUs.  A ``dst`` that is
    ``src`` under another name takes the scalar loop (LLVM's overlap check fails),
    hence None for in place."""
    out = _target(src, dst)
    n = src.size
    if code == _NONE:
        for i in range(n):
            out[i] = src[i] * scale + _at(shift, i)
    elif code == _RELU:
        for i in range(n):
            out[i] = act_value(1, src[i] * scale + _at(shift, i))
    elif code == _GELU:
        for i in range(n):
            out[i] = act_value(2, src[i] * scale + _at(shift, i))
    elif code == _GELU_TANH:
        for i in range(n):
            out[i] = act_value(3, src[i] * scale + _at(shift, i))
    elif code == _SILU:
        for i in range(n):
            out[i] = act_value(4, src[i] * scale + _at(shift, i))
    elif code == _SIGMOID:
        for i in range(n):
            out[i] = act_value(5, src[i] * scale + _at(shift, i))
    elif code == _TANH:
        for i in range(n):
            out[i] = act_value(6, src[i] * scale + _at(shift, i))


@inlined
def act_grad_row(code, src, scale, shift, grad, dst):
    """dst[:] = grad * act'(src * scale + shift), arguments as in ``act_row``."""
    out = _target(src, dst)
    n = src.size
    if code == _NONE:
        for i in range(n):
            out[i] = grad[i]
    elif code == _RELU:
        for i in range(n):
            out[i] = grad[i] * act_derivative(1, src[i] * scale + _at(shift, i))
    elif code == _GELU:
        for i in range(n):
            out[i] = grad[i] * act_derivative(2, src[i] * scale + _at(shift, i))
    elif code == _GELU_TANH:
        for i in range(n):
            out[i] = grad[i] * act_derivative(3, src[i] * scale + _at(shift, i))
    elif code == _SILU:
        for i in range(n):
            out[i] = grad[i] * act_derivative(4, src[i] * scale + _at(shift, i))
    elif code == _SIGMOID:
        for i in range(n):
            out[i] = grad[i] * act_derivative(5, src[i] * scale + _at(shift, i))
    elif code == _TANH:
        for i in range(n):
            out[i] = grad[i] * act_derivative(6, src[i] * scale + _at(shift, i))


_BLOCK = 8192


@kernel
def act_forward_flat(x, code):
    """act(x) over a contiguous 1-D array, in parallel blocks."""
    t = x.dtype.type
    out = np.empty_like(x)
    for k in prange((x.size + _BLOCK - 1) // _BLOCK):
        lo, hi = k * _BLOCK, min((k + 1) * _BLOCK, x.size)
        act_row(code, x[lo:hi], t(1.0), t(0.0), out[lo:hi])
    return out


@kernel
def act_backward_flat(x, grad, code):
    """act'(x) * grad over contiguous 1-D arrays, in parallel blocks."""
    t = x.dtype.type
    out = np.empty_like(x)
    for k in prange((x.size + _BLOCK - 1) // _BLOCK):
        lo, hi = k * _BLOCK, min((k + 1) * _BLOCK, x.size)
        act_grad_row(code, x[lo:hi], t(1.0), t(0.0), grad[lo:hi], out[lo:hi])
    return out


@kernel
def bias_act_rows(x, bias, code):
    """act(x + bias) for x [R, C] with bias [C] along the last axis."""
    t = x.dtype.type
    out = np.empty_like(x)
    for r in prange(x.shape[0]):
        act_row(code, x[r], t(1.0), bias, out[r])
    return out


@kernel
def bias_act_rows_(x, bias, code):
    """x[:] = act(x + bias) in place, for x [R, C] with bias [C] along the last axis."""
    t = x.dtype.type
    for r in prange(x.shape[0]):
        act_row(code, x[r], t(1.0), bias, None)


@kernel
def bias_act_rows_backward(x, bias, grad, code, chunks):
    """(d/dx, d/dbias) of ``bias_act_rows``; rows are split into ``chunks`` blocks
    that each sum their own share of d bias."""
    t = x.dtype.type
    rows, cols = x.shape
    out = np.empty_like(x)
    partial = np.zeros((chunks, cols), dtype=x.dtype)
    for k in prange(chunks):
        acc = partial[k]
        for r in range(k * rows // chunks, (k + 1) * rows // chunks):
            res = out[r]
            act_grad_row(code, x[r], t(1.0), bias, grad[r], res)
            for c in range(cols):
                acc[c] += res[c]
    return out, partial.sum(axis=0)


@kernel
def bias_act_planes(x, bias, code):
    """act(x + bias) for x [P, S] (the planes of a [outer, C, S] array) with plane p
    shifted by bias[p % C]."""
    t = x.dtype.type
    channels = bias.shape[0]
    out = np.empty_like(x)
    for p in prange(x.shape[0]):
        act_row(code, x[p], t(1.0), bias[p % channels], out[p])
    return out


@kernel
def bias_act_planes_backward(x, bias, grad, code):
    """d/dx of ``bias_act_planes`` and the per-plane sums of it ([P], for d bias)."""
    t = x.dtype.type
    channels = bias.shape[0]
    out = np.empty_like(x)
    plane_sums = np.empty(x.shape[0], dtype=x.dtype)
    for p in prange(x.shape[0]):
        res = out[p]
        act_grad_row(code, x[p], t(1.0), bias[p % channels], grad[p], res)
        acc = t(0.0)
        for s in range(res.size):
            acc += res[s]
        plane_sums[p] = acc
    return out, plane_sums
