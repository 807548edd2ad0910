"""Data types: tensorcore uses NumPy dtype objects, so promotion is NumPy's.

NumPy has no bfloat16; ``ml_dtypes`` (the package JAX uses) registers one, and CuPy
understands it.  bfloat16 tensors are a storage format: every kernel loads them into
float32, computes and accumulates in float32, and rounds the result back.
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


def result_dtype(*operands: Any) -> np.dtype:
    """NumPy's promotion of tensors' dtypes and Python scalars (NEP 50 weak scalars)."""
    return np.result_type(*operands)
