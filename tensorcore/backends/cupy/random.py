"""Counter-based GPU random numbers (cuda/rng.cu).

A generator is a seed plus a 2-word device buffer {Philox offset, ticket}; each draw
reads the offset on the device and the kernel advances it, so draws need no host round
trip and a draw captured in a CUDA graph yields new numbers on every replay.
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy

from .loader import grid_for, kernel, supports

RNG = "rng.cu"
_UNIFORM, _NORMAL = 0, 1


class CudaGenerator:
    """The backend generator object: ``seed`` and the device-side Philox state."""

    def __init__(self, seed: int) -> None:
        self.seed = numpy.uint64(seed % 2**64)
        self.state = cupy.zeros(2, dtype=numpy.uint64)


class CupyRandomKernels:
    """rng / uniform / normal / integers on the Philox kernel."""

    xp: Any

    def rng(self, seed: int) -> CudaGenerator:
        return CudaGenerator(seed)

    def _float_draw(self, rng: CudaGenerator, shape, kind: int, a: float, b: float, dtype):
        out = cupy.empty(tuple(shape), dtype=dtype)
        if out.size:
            work = -(-out.size // 4)
            kernel(RNG, "rng_float_kernel", out.dtype)(
                (grid_for(work),), (256,), (out, out.size, rng.state, rng.seed, kind, float(a),
                                            float(b)))
        return out

    def uniform(self, rng, shape, low, high, dtype):
        if not isinstance(rng, CudaGenerator) or not supports(dtype):
            return super().uniform(rng, shape, low, high, dtype)
        return self._float_draw(rng, shape, _UNIFORM, low, high, dtype)

    def normal(self, rng, shape, mean, std, dtype):
        if not isinstance(rng, CudaGenerator) or not supports(dtype):
            return super().normal(rng, shape, mean, std, dtype)
        return self._float_draw(rng, shape, _NORMAL, mean, std, dtype)

    def integers(self, rng, shape, low, high, dtype):
        if not isinstance(rng, CudaGenerator):
            return super().integers(rng, shape, low, high, dtype)
        if int(high) <= int(low):
            raise ValueError(f"integers: need low < high, got low={low}, high={high}")
        out = cupy.empty(tuple(shape), dtype=numpy.int64)
        if out.size:
            work = -(-out.size // 2)
            kernel(RNG, "rng_int_kernel")((grid_for(work),), (256,),
                                         (out, out.size, rng.state, rng.seed, int(low),
                                          numpy.uint64(int(high) - int(low))))
        return out.astype(dtype, copy=False)
