"""bfloat16 on kernels without a bfloat16 instantiation: compute in float32.

NumPy's bfloat16 (``ml_dtypes``) has elementwise loops, which already compute each
element in float32 and round once, but no BLAS, and its sums accumulate in bfloat16 and
lose digits after a few hundred terms.  So the ops that accumulate or multiply matrices
(``FLOAT32_COMPUTED_OPS``) run on float32 copies of their bfloat16 arguments and round
floating results back, as the CUDA kernels do per element.  Two details follow PyTorch:
normalisation statistics (mean, rstd) stay float32, and a result is rounded to bfloat16
only when NumPy's promotion of the floating arguments (statistics aside) gives bfloat16,
so bfloat16 with float32 computes and returns float32.

The NumPy backend's table wraps its reference kernels for these ops with
``computes_in_float32``.  The Numba and CuPy kernels hand a call they do not cover on to
that table entry (``super()``), so a bfloat16 call lands here and comes back to the
calling backend's own float32 kernel.  The CUDA kernels are instantiated for bfloat16
themselves and never get here.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..dtypes import bfloat16_dtype, float32, is_bfloat16, is_floating

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
    "attention_output", "attention_lse_backward",
    "bias_act_backward", "embedding_backward", "index_add_",
    "sgd_update_", "adam_update_", "rmsprop_update_", "adagrad_update_", "lamb_update_",
    "lars_update_", "lion_update_", *_NORM_STATS,
)
# ops that write into arrays they were given: the float32 copies are written back
_WRITES_ARGUMENTS = frozenset(op for op in FLOAT32_COMPUTED_OPS if op.endswith("_")) | {"batch_norm"}


def _is_bfloat16(a: Any) -> bool:
    return is_bfloat16(getattr(a, "dtype", None))  # arrays of any backend; names, flags, None have none


def _widened(a: Any) -> Any:
    return a.astype(float32) if _is_bfloat16(a) else a


def _narrowed(result: Any) -> Any:
    """A float32 result rounded to bfloat16; anything else (indices, None) as it is."""
    return result.astype(bfloat16_dtype()) if getattr(result, "dtype", None) == float32 else result


def computes_in_float32(kernel: Callable) -> Callable:
    """The backend method ``kernel`` (one of FLOAT32_COMPUTED_OPS): without bfloat16
    arguments, ``kernel`` itself; with them, the backend's method of that name again on
    float32 copies (so the fastest float32 kernel of the backend runs), results rounded
    back where the promotion of the floating arguments is bfloat16.

    The wrapper keeps the plain ``(*args, **kwargs)`` signature on purpose: compiled
    replay hands ``out=`` only to methods that declare it, and a float32 copy of a
    bfloat16 ``out`` would not be written back."""
    op = kernel.__name__
    if op not in FLOAT32_COMPUTED_OPS:
        raise ValueError(f"computes_in_float32: {op!r} is not one of FLOAT32_COMPUTED_OPS")
    stat_args, stat_results = _NORM_STATS.get(op, ((), ()))
    writes_back = op in _WRITES_ARGUMENTS

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        values = (*args, *kwargs.values())
        for a in values:  # a plain loop: this check runs on every call of the op
            if _is_bfloat16(a):
                break
        else:
            return kernel(self, *args, **kwargs)
        wide = [_widened(a) for a in args]
        wide_kw = {key: _widened(v) for key, v in kwargs.items()}
        out = getattr(self, op)(*wide, **wide_kw)
        if writes_back:
            for orig, copy in zip(values, (*wide, *wide_kw.values())):
                if copy is not orig:
                    orig[...] = copy
        floats = [a.dtype for i, a in enumerate(values) if i not in stat_args
                  and getattr(a, "dtype", None) is not None and is_floating(a.dtype)]
        if not is_bfloat16(np.result_type(*floats)):
            return out
        if isinstance(out, tuple):
            return tuple(r if i in stat_results else _narrowed(r) for i, r in enumerate(out))
        return _narrowed(out)

    run.__name__ = op
    run.__qualname__ = f"computes_in_float32({kernel.__qualname__})"
    run.__doc__ = kernel.__doc__
    run.kernel = kernel  # type: ignore[attr-defined]  # what runs for other dtypes
    return run
