"""Scalar activations the generated fused elementwise kernels call (``numba/fused.py``).

Each wraps ``act_value``, the expression the eager Numba activation kernels use,
compiled with the same options (so with the same contractions), so a fused chain
computes what the separate calls compute.
"""

from __future__ import annotations

from .activations import ACT_CODES, act_value
from .jit import helper


@helper
def act_relu(v):
    return act_value(1, v)


@helper
def act_gelu(v):
    return act_value(2, v)


@helper
def act_gelu_tanh(v):
    return act_value(3, v)


@helper
def act_silu(v):
    return act_value(4, v)


@helper
def act_sigmoid(v):
    return act_value(5, v)


@helper
def act_tanh(v):
    return act_value(6, v)


ACTIVATION_HELPERS = {name: f"act_{name}" for name in ACT_CODES if name != "none"}
