"""Data types and type promotion.

tensorcore uses NumPy dtype objects.  NumPy has no bfloat16; ``ml_dtypes`` (the
package JAX uses) registers one, and CuPy understands it.  bfloat16 tensors are a
storage format: every kernel loads them into float32, computes and accumulates in
float32, and rounds the result back.

Promotion follows PyTorch where it and NumPy disagree, so a float32 model stays
float32 (see ``docs/semantics.md`` for the table): a floating dtype wins over an
integer one whatever their sizes (float32 + int64 -> float32), a Python float meets
an integer tensor as the default float dtype (float32, not float64), and a 0-d tensor
or a Python scalar changes the result only when it raises the category
(bool < integer < floating).

Kernels instantiated for bfloat16 (the CUDA ones) compute in float32 themselves; for the
others, ``backends/bfloat16.py`` states the policy once.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

float16 = np.dtype("float16")
float32 = np.dtype("float32")
float64 = np.dtype("float64")
bfloat16 = np.dtype(ml_dtypes.bfloat16)
int32 = np.dtype("int32")
int64 = np.dtype("int64")
bool_ = np.dtype("bool")
uint8 = np.dtype("uint8")

SUPPORTED = (float16, bfloat16, float32, float64, int32, int64, bool_, uint8)
default_float = float32


def as_dtype(dtype: Any) -> np.dtype:
    """Normalise a user dtype (tc.float32, 'float32', np.float32, bool...) or raise."""
    if dtype is None:
        raise TypeError("dtype: None is not a dtype")
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype: {dtype!r} is not a dtype") from exc
    if dt not in SUPPORTED:
        raise TypeError(f"dtype: {dt} is not supported; use one of {[str(d) for d in SUPPORTED]}")
    return dt


def is_floating(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is a floating-point type (bfloat16's NumPy kind is "V")."""
    return dtype.kind == "f" or dtype == bfloat16


def promote_types(a: np.dtype, b: np.dtype) -> np.dtype:
    """The dtype two tensors' dtypes combine to (torch.promote_types): a floating dtype
    wins over an integer or bool one; within a category NumPy's lattice, which agrees
    with PyTorch's on the supported dtypes (float16 + bfloat16 -> float32)."""
    if a == b:
        return a
    if is_floating(a) != is_floating(b):
        return a if is_floating(a) else b
    if {a, b} == {float16, bfloat16}:  # older ml_dtypes releases define no common dtype
        return float32
    return np.promote_types(a, b)


def scalar_dtype(value: bool | int | float) -> np.dtype:
    """The dtype a Python scalar stands for: bool, int64 or the default float."""
    if isinstance(value, bool):
        return bool_
    return int64 if isinstance(value, int) else default_float


def result_dtype(*operands: Any) -> np.dtype:
    """The dtype of an elementwise op on tensors and Python scalars (torch.result_type).

    Operands fall in three tiers: tensors with dimensions, 0-d tensors, Python scalars.
    A lower tier changes the result only when its category (bool < integer < floating)
    is higher, e.g. int64[3] * 0.5 -> float32 but float32[3] * float64 0-d -> float32.
    """
    tiers: list[np.dtype | None] = [None, None, None]
    for x in operands:
        if isinstance(x, bool | int | float):
            tier, dtype = 2, scalar_dtype(x)
        else:
            tier, dtype = (0 if x.ndim else 1), x.dtype
        tiers[tier] = dtype if tiers[tier] is None else promote_types(tiers[tier], dtype)
    return _combine(tiers[0], _combine(tiers[1], tiers[2]))


def _combine(higher: np.dtype | None, lower: np.dtype | None) -> np.dtype | None:
    """A lower tier's dtype counts only where it raises the category."""
    if higher is None or lower is None:
        return lower if higher is None else higher
    if is_floating(higher) or (not is_floating(lower) and higher != bool_):
        return higher
    return promote_types(higher, lower)
