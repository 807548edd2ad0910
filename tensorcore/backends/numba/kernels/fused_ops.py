"""The scalar activation the generated fused elementwise kernels call (``numba/fused.py``),
and ``launder``, through which they pass its argument.

It wraps ``act_value``, the expression the eager Numba activation kernels use, compiled
with the same options (so with the same contractions), so a fused chain computes what
the separate calls compute.  The activation is a constant code at every call site, as
``act_value`` requires: Numba compiles the helper once per activation, holding that
activation only, and LLVM inlines it.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .activations import ACT_CODES, act_value
from .jit import helper

__all__ = ["ACT_CODES", "activation", "launder"]


@helper
def activation(code, v):
    return act_value(code, v)


@intrinsic
def launder(typingctx, x, blind):
    """x with its bits xor-ed with ``blind``, a runtime 0 (a kernel argument): the
    value is x, but LLVM no longer knows what the code before it implies about x.

    Inside a fused chain an activation's argument is a register, not a load, and the
    compiler could otherwise use its range (x >= 0 after an ``abs``) to fold the
    activation's branches (Φ = q or 1 - q), which changes where multiply-adds contract:
    the result would differ from the eager kernel's in the last bit.  One integer xor
    per element; the loop still vectorises."""
    if not isinstance(x, types.Float) or not isinstance(blind, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        value, zero = args
        bits = ir.IntType(x.bitwidth)
        if blind.bitwidth < x.bitwidth:
            mask = builder.sext(zero, bits)
        elif blind.bitwidth > x.bitwidth:
            mask = builder.trunc(zero, bits)
        else:
            mask = zero
        return builder.bitcast(builder.xor(builder.bitcast(value, bits), mask), value.type)

    return x(x, blind), codegen
