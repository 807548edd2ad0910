"""Data types and type promotion.

tensorcore uses NumPy dtype objects.  NumPy has no bfloat16; ``ml_dtypes`` (the
package JAX uses) registers one, and CuPy understands it.  bfloat16 tensors are a
storage format: every kernel loads them into float32, computes and accumulates in
float32, and rounds the result back.  Importing ``ml_dtypes`` takes most of a second
(it registers NumPy loops for a dozen dtypes), so it is imported when bfloat16 is first
asked for (``tc.bfloat16``, the name "bfloat16"); checks on a dtype in hand go by its
name (``is_bfloat16``), since a bfloat16 array cannot exist before that import.

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

import functools
import sys
from typing import Any

import numpy as np

float16 = np.dtype("float16")
float32 = np.dtype("float32")
float64 = np.dtype("float64")
int32 = np.dtype("int32")
int64 = np.dtype("int64")
bool_ = np.dtype("bool")
uint8 = np.dtype("uint8")

SUPPORTED = ("float16", "bfloat16", "float32", "float64", "int32", "int64", "bool", "uint8")  # dtype names
default_float = float32


@functools.cache
def bfloat16_dtype() -> np.dtype:
    """NumPy's bfloat16 dtype (``ml_dtypes``', imported on the first call); also
    ``tensorcore.dtypes.bfloat16`` and ``tc.bfloat16``."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def loaded_bfloat16() -> np.dtype | None:
    """bfloat16's dtype once ``ml_dtypes`` is imported, else None (and then no bfloat16
    value or type can exist yet)."""
    return bfloat16_dtype() if "ml_dtypes" in sys.modules else None


def __getattr__(name: str) -> Any:
    if name == "bfloat16":
        return bfloat16_dtype()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_bfloat16(dtype: Any) -> bool:
    """Whether ``dtype`` (a NumPy dtype, or None) is bfloat16, without importing ``ml_dtypes``
    (its kind is "V"; ``name`` builds a string, so it is read for such dtypes only)."""
    return isinstance(dtype, np.dtype) and dtype.kind == "V" and dtype.name == "bfloat16"


def is_supported(dtype: np.dtype) -> bool:
    """Whether tensors can hold ``dtype``: one of ``SUPPORTED``, in native byte order."""
    return dtype.isnative and dtype.name in SUPPORTED


def as_dtype(dtype: Any) -> np.dtype:
    """Normalise a user dtype (tc.float32, 'float32', np.float32, bool...) or raise."""
    if dtype is None:
        raise TypeError("dtype: None is not a dtype")
    if isinstance(dtype, str) and dtype == "bfloat16":
        return bfloat16_dtype()  # NumPy knows the name once ml_dtypes is imported
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype: {dtype!r} is not a dtype") from exc
    if not is_supported(dt):
        raise TypeError(f"dtype: {dt} is not supported; use one of {list(SUPPORTED)}")
    return dt


def is_floating(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is a floating-point type (bfloat16's NumPy kind is "V")."""
    return dtype.kind == "f" or is_bfloat16(dtype)


def promote_types(a: np.dtype, b: np.dtype) -> np.dtype:
    """The dtype two tensors' dtypes combine to (torch.promote_types): a floating dtype
    wins over an integer or bool one; within a category NumPy's lattice, which agrees
    with PyTorch's on the supported dtypes (float16 + bfloat16 -> float32)."""
    if a == b:
        return a
    if is_floating(a) != is_floating(b):
        return a if is_floating(a) else b
    if {a.name, b.name} == {"float16", "bfloat16"}:  # older ml_dtypes releases define no common dtype
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
