"""The scalar activation the generated fused elementwise kernels call (``numba/fused.py``).

It wraps ``act_value``, the expression the eager Numba activation kernels use, compiled
with the same options (no fast-math, so no multiply-add is contracted differently in a
chain), so a fused chain computes what the separate calls compute.  The activation is a
constant code at every call site, as ``act_value`` requires: Numba compiles the helper
once per activation, holding that activation only, and LLVM inlines it.
"""

from __future__ import annotations

from .activations import ACT_CODES, act_value
from .jit import helper

__all__ = ["ACT_CODES", "activation"]


@helper
def activation(code, v):
    return act_value(code, v)
