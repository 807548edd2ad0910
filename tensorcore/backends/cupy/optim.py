"""CuPy optimizer updates: one fused RawKernel launch per call (cuda/optim.cu).

Each update runs over a whole flat buffer in place, reading ``lr`` / ``step`` from
1-element device arrays, so it never synchronizes with the host and can be captured
in a CUDA graph.  LAMB and LARS use a small per-tensor sums buffer kept per (device,
tensor count): it must outlive any graph that captured it, so it is never freed.
Inputs the kernels do not cover (non-contiguous buffers, unsupported or mixed dtypes,
device scalars of another dtype, empty buffers) go to the xp reference.
"""

from __future__ import annotations

import math
from typing import Any

import cupy

from .loader import kernel, launch, sm_count
from .util import DeviceBuffers, acc_dtype, aligned, has_kernels, pack_width, ptr

OPTIM = "optim.cu"
RANGE_THREADS = 256


def _fused(p: Any, buffers: tuple, scalars: tuple) -> bool:
    """Whether the fused kernels take these arguments."""
    arrays = (p,) + tuple(b for b in buffers if b is not None)
    return (has_kernels(*arrays) and all(a.flags.c_contiguous and a.size == p.size for a in arrays)
            and all(isinstance(s, cupy.ndarray) and s.dtype == acc_dtype(p.dtype) for s in scalars))


def _elementwise(name: str, p: Any, buffers: tuple, args: tuple) -> None:
    """Launch an elementwise update over p's n elements, in 16-byte packs if aligned."""
    vec = aligned(p, *buffers)
    n = p.size
    work = math.ceil(n / pack_width(p.dtype)) if vec else n
    launch(OPTIM, name, p.dtype, work, args + (n, int(vec)))


def _sums(buffers: DeviceBuffers, count: int) -> Any:
    """A zeroed [count, 2] float64 sums buffer of the current device."""
    key = ("sums", cupy.cuda.Device().id, count)
    sums = buffers.take(key, 2 * count, lambda n: cupy.zeros((n // 2, 2), dtype=cupy.float64))
    sums.fill(0)
    return sums


def _ranges_ok(ranges: Any) -> bool:
    return ranges.dtype == cupy.int64 and ranges.flags.c_contiguous and ranges.ndim == 2 and ranges.shape[0] > 0


def _range_grid(n: int, count: int) -> tuple[int, int]:
    chunks = max(1, min(math.ceil(n / (count * RANGE_THREADS)), sm_count() * 8))
    return chunks, count


class CupyOptimKernels:
    """sgd / adam / rmsprop / adagrad / lamb / lars / lion updates on RawKernels."""

    def sgd_update_(self, p, g, buf, lr, momentum, dampening, nesterov, weight_decay, first_step) -> None:
        if not _fused(p, (g, buf), (lr, first_step)):
            return super().sgd_update_(p, g, buf, lr, momentum, dampening, nesterov, weight_decay, first_step)
        _elementwise("sgd_kernel", p, (g, buf), (p, g, ptr(buf), lr, first_step, float(momentum),
                                                 float(dampening), int(nesterov), float(weight_decay)))

    def adam_update_(self, p, g, m, v, vmax, lr, step, beta1, beta2, eps, weight_decay, decoupled) -> None:
        if not _fused(p, (g, m, v, vmax), (lr, step)):
            return super().adam_update_(p, g, m, v, vmax, lr, step, beta1, beta2, eps, weight_decay, decoupled)
        _elementwise("adam_kernel", p, (g, m, v, vmax),
                     (p, g, m, v, ptr(vmax), lr, step, float(beta1), float(beta2), float(eps),
                      float(weight_decay), int(decoupled)))

    def rmsprop_update_(self, p, g, square_avg, grad_avg, buf, lr, alpha, eps, weight_decay, momentum,
                        centered) -> None:
        if not _fused(p, (g, square_avg, grad_avg, buf), (lr,)):
            return super().rmsprop_update_(p, g, square_avg, grad_avg, buf, lr, alpha, eps, weight_decay,
                                           momentum, centered)
        grad_avg = grad_avg if centered else None
        buf = buf if momentum > 0 else None
        _elementwise("rmsprop_kernel", p, (g, square_avg, grad_avg, buf),
                     (p, g, square_avg, ptr(grad_avg), ptr(buf), lr, float(alpha), float(eps),
                      float(weight_decay), float(momentum)))

    def adagrad_update_(self, p, g, state_sum, lr, step, lr_decay, weight_decay, eps) -> None:
        if not _fused(p, (g, state_sum), (lr, step)):
            return super().adagrad_update_(p, g, state_sum, lr, step, lr_decay, weight_decay, eps)
        _elementwise("adagrad_kernel", p, (g, state_sum),
                     (p, g, state_sum, lr, step, float(lr_decay), float(weight_decay), float(eps)))

    def lion_update_(self, p, g, m, lr, beta1, beta2, weight_decay) -> None:
        if not _fused(p, (g, m), (lr,)):
            return super().lion_update_(p, g, m, lr, beta1, beta2, weight_decay)
        _elementwise("lion_kernel", p, (g, m), (p, g, m, lr, float(beta1), float(beta2), float(weight_decay)))

    def lamb_update_(self, p, g, m, v, ranges, lr, step, beta1, beta2, eps, weight_decay) -> None:
        if not _fused(p, (g, m, v), (lr, step)) or not _ranges_ok(ranges):
            return super().lamb_update_(p, g, m, v, ranges, lr, step, beta1, beta2, eps, weight_decay)
        count = ranges.shape[0]
        sums, grid = _sums(self.buffers, count), _range_grid(p.size, count)
        coefficients = (float(beta1), float(beta2), float(eps), float(weight_decay))
        kernel(OPTIM, "lamb_moments_kernel", p.dtype)(grid, (RANGE_THREADS,),
                                                       (p, g, m, v, ranges, sums, step) + coefficients)
        kernel(OPTIM, "lamb_apply_kernel", p.dtype)(grid, (RANGE_THREADS,),
                                                     (p, m, v, ranges, sums, lr, step) + coefficients)

    def lars_update_(self, p, g, buf, ranges, lr, momentum, weight_decay, trust_coefficient, eps) -> None:
        if not _fused(p, (g, buf), (lr,)) or not _ranges_ok(ranges):
            return super().lars_update_(p, g, buf, ranges, lr, momentum, weight_decay, trust_coefficient, eps)
        count = ranges.shape[0]
        sums, grid = _sums(self.buffers, count), _range_grid(p.size, count)
        kernel(OPTIM, "lars_norms_kernel", p.dtype)(grid, (RANGE_THREADS,), (p, g, ranges, sums))
        kernel(OPTIM, "lars_apply_kernel", p.dtype)(grid, (RANGE_THREADS,),
                                                     (p, g, buf, ranges, sums, lr, float(momentum),
                                                      float(weight_decay), float(trust_coefficient),
                                                      float(eps)))
