"""Numba versions of the optimizer updates: one fused parallel pass per call over
the flat parameter / gradient / state buffers (see ``numpy.optim`` for the maths and
the meaning of every argument)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .kernels import fast_path

Array = Any


def _flat(*buffers: Array | None) -> bool:
    """True when the kernels can update these buffers in place: one float dtype,
    1-D, C-contiguous and all of the same length."""
    present = [b for b in buffers if b is not None]
    return (fast_path(*present) and all(b.ndim == 1 and b.flags.c_contiguous for b in present)
            and len({b.size for b in present}) == 1)


def _checked_ranges(op: str, ranges: Array, size: int) -> Array:
    """ranges as a contiguous int64 [K, 2] array whose (start, stop) pairs lie in the
    buffer (the kernels index with them)."""
    ranges = np.ascontiguousarray(ranges, dtype=np.int64)
    if ranges.ndim != 2 or ranges.shape[1] != 2:
        raise ValueError(f"{op}: ranges must be [K, 2] (start, stop) pairs, got shape {ranges.shape}")
    if ranges.size and (ranges.min() < 0 or ranges.max() > size or (ranges[:, 0] > ranges[:, 1]).any()):
        raise ValueError(f"{op}: ranges must satisfy 0 <= start <= stop <= {size}")
    return ranges


class NumbaOptimKernels:
    """SGD, Adam/AdamW, RMSProp, Adagrad, LAMB, LARS and Lion updates."""

    def sgd_update_(self, p: Array, g: Array, buf: Array | None, lr: Array, momentum: float,
                    dampening: float, nesterov: bool, weight_decay: float, first_step: Array) -> None:
        if not _flat(p, g, buf):
            return super().sgd_update_(p, g, buf, lr, momentum, dampening, nesterov,
                                       weight_decay, first_step)
        from .kernels import optim as K

        K.sgd(p, g, buf if momentum != 0 else None, lr, float(momentum), float(dampening),
              bool(nesterov), float(weight_decay), first_step)

    def adam_update_(self, p: Array, g: Array, m: Array, v: Array, vmax: Array | None, lr: Array,
                     step: Array, beta1: float, beta2: float, eps: float, weight_decay: float,
                     decoupled: bool) -> None:
        if not _flat(p, g, m, v, vmax):
            return super().adam_update_(p, g, m, v, vmax, lr, step, beta1, beta2, eps,
                                        weight_decay, decoupled)
        from .kernels import optim as K

        K.adam(p, g, m, v, vmax, lr, step, float(beta1), float(beta2), float(eps),
               float(weight_decay), bool(decoupled))

    def rmsprop_update_(self, p: Array, g: Array, square_avg: Array, grad_avg: Array | None,
                        buf: Array | None, lr: Array, alpha: float, eps: float, weight_decay: float,
                        momentum: float, centered: bool) -> None:
        if not _flat(p, g, square_avg, grad_avg, buf):
            return super().rmsprop_update_(p, g, square_avg, grad_avg, buf, lr, alpha, eps,
                                           weight_decay, momentum, centered)
        from .kernels import optim as K

        K.rmsprop(p, g, square_avg, grad_avg if centered else None,
                  buf if momentum > 0 else None, lr, float(alpha), float(eps),
                  float(weight_decay), float(momentum))

    def adagrad_update_(self, p: Array, g: Array, state_sum: Array, lr: Array, step: Array,
                        lr_decay: float, weight_decay: float, eps: float) -> None:
        if not _flat(p, g, state_sum):
            return super().adagrad_update_(p, g, state_sum, lr, step, lr_decay, weight_decay, eps)
        from .kernels import optim as K

        K.adagrad(p, g, state_sum, lr, step, float(lr_decay), float(weight_decay), float(eps))

    def lamb_update_(self, p: Array, g: Array, m: Array, v: Array, ranges: Array, lr: Array,
                     step: Array, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
        if not _flat(p, g, m, v):
            return super().lamb_update_(p, g, m, v, ranges, lr, step, beta1, beta2, eps,
                                        weight_decay)
        from .kernels import optim as K

        K.lamb(p, g, m, v, _checked_ranges("lamb_update_", ranges, p.size), lr, step,
               float(beta1), float(beta2), float(eps), float(weight_decay))

    def lars_update_(self, p: Array, g: Array, buf: Array, ranges: Array, lr: Array,
                     momentum: float, weight_decay: float, trust_coefficient: float,
                     eps: float) -> None:
        if not _flat(p, g, buf):
            return super().lars_update_(p, g, buf, ranges, lr, momentum, weight_decay,
                                        trust_coefficient, eps)
        from .kernels import optim as K

        K.lars(p, g, buf, _checked_ranges("lars_update_", ranges, p.size), lr, float(momentum),
               float(weight_decay), float(trust_coefficient), float(eps))

    def lion_update_(self, p: Array, g: Array, m: Array, lr: Array, beta1: float, beta2: float,
                     weight_decay: float) -> None:
        if not _flat(p, g, m):
            return super().lion_update_(p, g, m, lr, beta1, beta2, weight_decay)
        from .kernels import optim as K

        K.lion(p, g, m, lr, float(beta1), float(beta2), float(weight_decay))
