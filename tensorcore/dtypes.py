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
others, ``ComputesBfloat16InFloat32`` below states the policy once.
"""

from __future__ import annotations

from typing import Any, Callable

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


# ----- bfloat16 on kernels without a bfloat16 instantiation -------------------------------
# NumPy's bfloat16 has elementwise loops, which already compute each element in float32
# and round once, but no BLAS, and its sums accumulate in bfloat16 and lose digits after
# a few hundred terms.  So the ops that accumulate or multiply matrices run on float32
# copies of their bfloat16 arguments and round floating results back, as the CUDA
# kernels do per element.  Two details follow PyTorch: normalisation statistics (mean,
# rstd) stay float32, and a result is rounded to bfloat16 only when NumPy's promotion of
# the floating arguments (statistics aside) gives bfloat16, so bfloat16 with float32
# computes and returns float32.

# op -> (positions of float32 statistics among its arguments, positions among its results;
# cross-entropy's float64 divisor is such an argument: it takes no part in the promotion)
_NORM_STATS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "layer_norm": ((), (1, 2)),
    "group_norm": ((), (1, 2)),
    "batch_norm": ((), (1, 2)),
    "layer_norm_backward": ((3, 4), ()),
    "group_norm_backward": ((4, 5), ()),
    "batch_norm_backward": ((3, 4), ()),
    "cross_entropy_reduced_backward": ((5,), ()),
}

# the ops that accumulate (sums, products, scatter-adds) or multiply matrices; pure
# elementwise ops and data movement keep NumPy's own bfloat16 loops
FLOAT32_COMPUTED_OPS = (
    "reduce", "matmul", "lora_linear", "conv2d", "conv2d_grad_input", "conv2d_grad_weight",
    "avg_pool2d", "avg_pool2d_backward", "max_pool2d_backward",
    "upsample_nearest2d_backward", "upsample_bilinear2d", "upsample_bilinear2d_backward",
    "softmax", "softmax_backward", "log_softmax", "log_softmax_backward",
    "cross_entropy", "cross_entropy_backward", "cross_entropy_reduced", "attention", "attention_backward",
    "bias_act_backward", "embedding_backward", "index_add_",
    "sgd_update_", "adam_update_", "rmsprop_update_", "adagrad_update_", "lamb_update_",
    "lars_update_", "lion_update_", *_NORM_STATS,
)
# ops that write into arrays they were given: the float32 copies are written back
_WRITES_ARGUMENTS = frozenset(op for op in FLOAT32_COMPUTED_OPS if op.endswith("_")) | {"batch_norm"}


def _is_bfloat16(a: Any) -> bool:
    dtype = getattr(a, "dtype", None)  # arrays of any backend; names, flags, None have none
    return dtype is not None and dtype == bfloat16


def _widened(a: Any) -> Any:
    return a.astype(float32) if _is_bfloat16(a) else a


def _narrowed(result: Any) -> Any:
    """A float32 result rounded to bfloat16; anything else (indices, None) as it is."""
    return result.astype(bfloat16) if getattr(result, "dtype", None) == float32 else result


def _float32_computed(op: str) -> Callable:
    """The method ``op`` of ComputesBfloat16InFloat32: without bfloat16 arguments, the
    next implementation in the MRO; with them, ``op`` again on float32 copies (so the
    fastest float32 kernel of the backend runs), results rounded back where the
    promotion of the floating arguments is bfloat16."""
    stat_args, stat_results = _NORM_STATS.get(op, ((), ()))
    writes_back = op in _WRITES_ARGUMENTS

    def run(self, *args: Any, **kwargs: Any) -> Any:
        values = (*args, *kwargs.values())
        for a in values:  # a plain loop: this check runs on every call of the op
            if _is_bfloat16(a):
                break
        else:
            return getattr(super(ComputesBfloat16InFloat32, self), op)(*args, **kwargs)
        wide = [_widened(a) for a in args]
        wide_kw = {key: _widened(v) for key, v in kwargs.items()}
        out = getattr(self, op)(*wide, **wide_kw)
        if writes_back:
            for orig, copy in zip(values, (*wide, *wide_kw.values())):
                if copy is not orig:
                    orig[...] = copy
        floats = [a.dtype for i, a in enumerate(values) if i not in stat_args
                  and getattr(a, "dtype", None) is not None and is_floating(a.dtype)]
        if np.result_type(*floats) != bfloat16:
            return out
        if isinstance(out, tuple):
            return tuple(r if i in stat_results else _narrowed(r) for i, r in enumerate(out))
        return _narrowed(out)

    run.__name__ = run.__qualname__ = op
    return run


class ComputesBfloat16InFloat32:
    """A mixin for backends whose kernels have no bfloat16 instantiation, placed before
    them in the bases: each op of FLOAT32_COMPUTED_OPS given bfloat16 arrays computes in
    float32 (see above).  A backend that subclasses one with this mixin and has its own
    bfloat16 kernels reaches it only where its kernels hand a call on to the parent."""


for _op in FLOAT32_COMPUTED_OPS:
    setattr(ComputesBfloat16InFloat32, _op, _float32_computed(_op))
del _op
