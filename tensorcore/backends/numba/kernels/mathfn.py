"""Scalar math for the kernels: ``exp``, the normal CDF and ``tanh``, vectorisable.

Numba lowers ``math.exp`` on float32 to a scalar libm call, which stops LLVM from
vectorising the loop around it.  For float32 these helpers use polynomial forms
built from arithmetic and one bit cast, accurate to a few float32 ulps, so loops
over them compile to AVX code.  For float64 they call ``math`` (full precision).

The float32 polynomials are evaluated with explicit fused multiply-adds
(``_fma_f32``: one rounding each, so the same bits wherever LLVM places the code),
about a quarter faster than separate multiplies and adds.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload, register_jitable

from .jit import JIT_OPTIONS

_SQRT_HALF = 0.7071067811865476


@intrinsic
def _int32_bits_as_float32(typingctx, bits):
    """Reinterpret the low 32 bits of an integer as a float32 (no conversion)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        low = builder.trunc(args[0], ir.IntType(32)) if bits.bitwidth > 32 else args[0]
        return builder.bitcast(low, ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _fma_f32(typingctx, a, b, c):
    """a * b + c for float32, rounded once (LLVM's ``llvm.fma``: the FMA instruction)."""
    if not (a == b == c == types.float32):
        return None

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fma = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fma, args)

    return types.float32(a, b, c), codegen


@register_jitable(**JIT_OPTIONS)
def _exp_f32(x):
    """exp(x) for float32: 2**n * p(r) with x = n*ln2 + r, |r| <= ln2/2 (Cephes).

    Below -87.3 the result is 0 (no denormals) and above float32's overflow point
    (88.72) it is inf, so 1 / (1 + exp(-x)) is exactly 0 for very negative x; the
    polynomial itself runs on x clamped to that range, and 2**n is applied as two
    normal powers of two (n reaches 128 at the top), exact multiplies both."""
    c = min(max(x, np.float32(-87.3)), np.float32(88.72))
    n = np.floor(_fma_f32(c, np.float32(1.44269504), np.float32(0.5)))
    r = _fma_f32(n, np.float32(-0.693359375), c)  # ln2 in two parts: c - n*ln2 exactly enough
    r = _fma_f32(n, np.float32(2.12194440e-4), r)
    p = np.float32(1.9875691500e-4)
    p = _fma_f32(p, r, np.float32(1.3981999507e-3))
    p = _fma_f32(p, r, np.float32(8.3334519073e-3))
    p = _fma_f32(p, r, np.float32(4.1665795894e-2))
    p = _fma_f32(p, r, np.float32(1.6666665459e-1))
    p = _fma_f32(p, r, np.float32(5.0000001201e-1))
    p = _fma_f32(p, r * r, r + np.float32(1.0))
    low = np.int32(n) >> 1
    high = np.int32(n) - low
    y = p * _int32_bits_as_float32((low + 127) << 23) * _int32_bits_as_float32((high + 127) << 23)
    y = y if x >= np.float32(-87.3) else np.float32(0.0)
    return y if x <= np.float32(88.72) else np.float32(np.inf)


def fexp(x):
    """exp(x) in the dtype of ``x`` (vectorisable for float32)."""
    return math.exp(x)


def fnormcdf(x):
    """The standard normal CDF Φ(x) in the dtype of ``x`` (vectorisable for float32).

    Computed from the erfc tail, never as 1 + erf(x/√2), so Φ of a large negative x
    is tiny instead of the rounding error of a cancellation."""
    return 0.5 * math.erfc(-x * _SQRT_HALF)


def ftanh(x):
    """tanh(x) in the dtype of ``x`` (vectorisable for float32)."""
    return math.tanh(x)


@overload(fexp, jit_options=JIT_OPTIONS)
def _fexp_impl(x):
    if x == types.float32:
        return lambda x: _exp_f32(x)
    return lambda x: math.exp(x)


@register_jitable(**JIT_OPTIONS)
def _normcdf_f32(x):
    """Φ(x) for float32 via Abramowitz & Stegun 7.1.26 for erfc (|error| < 1.5e-7):
    the tail q = erfc(|x|/√2) / 2, then Φ = q or 1 - q."""
    a = abs(x) * np.float32(_SQRT_HALF)
    t = np.float32(1.0) / (np.float32(1.0) + np.float32(0.3275911) * a)
    p = np.float32(1.061405429)
    p = _fma_f32(p, t, np.float32(-1.453152027))
    p = _fma_f32(p, t, np.float32(1.421413741))
    p = _fma_f32(p, t, np.float32(-0.284496736))
    p = _fma_f32(p, t, np.float32(0.254829592))
    q = np.float32(0.5) * p * t * _exp_f32(-a * a)
    return q if x < np.float32(0.0) else np.float32(1.0) - q


@overload(fnormcdf, jit_options=JIT_OPTIONS)
def _fnormcdf_impl(x):
    if x == types.float32:
        return lambda x: _normcdf_f32(x)
    return lambda x: 0.5 * math.erfc(-x * _SQRT_HALF)


@register_jitable(**JIT_OPTIONS)
def _tanh_f32(x):
    """tanh(x): for |x| < 0.625 Cephes' odd polynomial (1 - e would cancel there), else
    sign(x) (1 - e) / (1 + e) with e = exp(-2|x|) <= 0.29, free of cancellation."""
    z = x * x
    p = np.float32(-5.70498872745e-3)
    p = _fma_f32(p, z, np.float32(2.06390887954e-2))
    p = _fma_f32(p, z, np.float32(-5.37397155531e-2))
    p = _fma_f32(p, z, np.float32(1.33314422036e-1))
    p = _fma_f32(p, z, np.float32(-3.33332819422e-1))
    small = _fma_f32(p * z, x, x)
    e = _exp_f32(np.float32(-2.0) * abs(x))
    y = (np.float32(1.0) - e) / (np.float32(1.0) + e)
    large = y if x >= np.float32(0.0) else -y
    return small if abs(x) < np.float32(0.625) else large


@overload(ftanh, jit_options=JIT_OPTIONS)
def _ftanh_impl(x):
    if x == types.float32:
        return lambda x: _tanh_f32(x)
    return lambda x: math.tanh(x)
