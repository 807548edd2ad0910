"""bfloat16 where a kernel has no bfloat16 instantiation: stored in bfloat16, computed in float32.

NumPy's bfloat16 (from ``ml_dtypes``) has elementwise loops, which already compute
each element in float32 and round once, but no BLAS, and its sums accumulate in
bfloat16 and lose digits after a few hundred terms.  So the ops that accumulate or
multiply matrices widen their bfloat16 arguments to float32, run the float32 kernel
and round floating results back: what the CUDA kernels do per element (load as
float, accumulate in float, store rounded).  The CuPy backend's kernels are
instantiated for bfloat16 themselves and reach this only through their fallbacks.

Two details follow PyTorch: normalisation statistics (mean, rstd) stay float32, and a
result is rounded to bfloat16 only when NumPy's promotion of the floating arguments
(statistics aside) gives bfloat16, so bfloat16 with float32 computes and returns
float32.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy

from ..dtypes import bfloat16, is_floating

FLOAT32 = numpy.dtype(numpy.float32)

# (op, positions of float32 statistics among its arguments, positions among its results)
_NORM_STATS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "layer_norm": ((), (1, 2)),
    "group_norm": ((), (1, 2)),
    "batch_norm": ((), (1, 2)),
    "layer_norm_backward": ((3, 4), ()),
    "group_norm_backward": ((4, 5), ()),
    "batch_norm_backward": ((3, 4), ()),
}

# the ops that accumulate (sums, products, scatter-adds) or multiply matrices; pure
# elementwise ops and data movement keep NumPy's own bfloat16 loops
WIDENED_OPS = (
    "reduce", "matmul", "conv2d", "conv2d_grad_input", "conv2d_grad_weight",
    "avg_pool2d", "avg_pool2d_backward", "max_pool2d_backward",
    "upsample_nearest2d_backward", "upsample_bilinear2d", "upsample_bilinear2d_backward",
    "softmax", "softmax_backward", "log_softmax", "log_softmax_backward",
    "cross_entropy", "cross_entropy_backward", "attention", "attention_backward",
    "bias_act_backward", "embedding_backward", "index_add_",
    "sgd_update_", "adam_update_", "rmsprop_update_", "adagrad_update_", "lamb_update_",
    "lars_update_", "lion_update_", *_NORM_STATS,
)
# ops that write into arrays they were given: widened copies are written back
_WRITES_ARGUMENTS = frozenset(name for name in WIDENED_OPS if name.endswith("_")) | {"batch_norm"}


# the array types the wrapped ops may receive; the CuPy backend adds cupy.ndarray.  A
# type test first keeps the check cheap for the other arguments (names, flags, None).
ARRAY_TYPES: set[type] = {numpy.ndarray}


def _is_bfloat16(a: Any) -> bool:
    return type(a) in ARRAY_TYPES and a.dtype == bfloat16


def _widen(a: Any) -> Any:
    return a.astype(FLOAT32) if _is_bfloat16(a) else a


def _narrowed(result: Any) -> Any:
    """A float32 result rounded to bfloat16; anything else (indices, None) as it is."""
    return result.astype(bfloat16) if getattr(result, "dtype", None) == FLOAT32 else result


def _promoted(values: tuple, skip: tuple[int, ...]) -> Any:
    """NumPy's promotion of the floating array arguments, leaving out positions ``skip``."""
    floats = [a.dtype for i, a in enumerate(values) if i not in skip and type(a) in ARRAY_TYPES
              and is_floating(a.dtype)]
    return numpy.result_type(*floats)


def _widened(op: str, method: Callable) -> Callable:
    """``method`` run on float32 copies of its bfloat16 arguments (written back where the
    op writes into them), its results rounded back where the promotion is bfloat16."""
    stat_args, stat_results = _NORM_STATS.get(op, ((), ()))
    writes_back = op in _WRITES_ARGUMENTS

    @functools.wraps(method)
    def run(self, *args: Any, **kwargs: Any) -> Any:
        values = (*args, *kwargs.values())
        for a in values:  # a plain loop: this check runs on every call of the op
            if type(a) in ARRAY_TYPES and a.dtype == bfloat16:
                break
        else:
            return method(self, *args, **kwargs)
        wide_kw = {key: _widen(v) for key, v in kwargs.items()}
        wide = [_widen(a) for a in args]
        out = method(self, *wide, **wide_kw)
        if writes_back:
            for orig, copy in zip(values, (*wide, *wide_kw.values())):
                if copy is not orig:
                    orig[...] = copy
        if _promoted(values, stat_args) != bfloat16:
            return out
        if isinstance(out, tuple):
            return tuple(r if i in stat_results else _narrowed(r) for i, r in enumerate(out))
        return _narrowed(out)

    return run


def computes_bfloat16_in_float32(cls: type) -> type:
    """Class decorator: wrap ``cls``'s accumulating ops (as resolved on ``cls``) so
    bfloat16 arguments are computed in float32 and results rounded back."""
    for op in WIDENED_OPS:
        if hasattr(cls, op):
            setattr(cls, op, _widened(op, getattr(cls, op)))
    return cls
