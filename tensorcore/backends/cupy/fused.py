"""``fused_elementwise`` on CuPy: one generated RawKernel per program and output ndim
(``fused_source.py``), compiled by NVRTC once and kept in CuPy's on-disk kernel cache
(``CUPY_CACHE_DIR``), which is keyed by a hash of the source."""

from __future__ import annotations

import functools
from typing import Any, Sequence

import cupy
import numpy

from ... import settings
from .. import fused_program
from . import fused_source, loader

_INT32_LIMIT = 1 << 31


@functools.lru_cache(maxsize=256)
def _kernel(program: tuple, rank: int) -> Any:
    if settings.debug_level >= 2:
        print(f"[tensorcore] generated fused kernel\n{fused_source.kernel_source(program, rank)}")
    module = cupy.RawModule(code=fused_source.source(program, rank), options=loader.OPTIONS)
    return module.get_function(fused_source.NAME)


class CupyFusedKernels:
    """A fused elementwise chain as one kernel launch (capturable in a CUDA graph)."""

    def fused_elementwise(self, program: tuple, inputs: Sequence[Any]):
        kinds = fused_program.check(program, [a.dtype.name for a in inputs])
        if any(type(a) is not cupy.ndarray for a in inputs):
            return super().fused_elementwise(program, inputs)
        shape = numpy.broadcast_shapes(*[a.shape for a in inputs])
        out = cupy.empty(shape, kinds[-1])
        if out.size == 0:
            return out
        strides = [tuple(s // a.dtype.itemsize for s in cupy.broadcast_to(a, shape).strides) for a in inputs]
        dims, merged = fused_program.collapse(shape, [tuple(s // out.dtype.itemsize for s in out.strides)] + strides)
        rank = max(1, len(shape))  # merged dims padded back: one kernel per program and ndim
        pad = rank - len(dims)
        args = [*inputs, out, numpy.int64(out.size), *[numpy.int64(d) for d in ((1,) * pad + dims)[1:]]]
        args += [numpy.int64(s) for st in merged[1:] for s in (0,) * pad + st]
        self.warm_fused(program, rank)((loader.grid_for(out.size),), (loader.THREADS,), tuple(args))
        return out

    def warm_fused(self, program: tuple, ndim: int) -> Any:
        """The kernel of ``program`` for ``ndim``-dimensional outputs, compiled now
        (compiled replay calls this before a CUDA graph capture begins)."""
        return _kernel(program, max(1, ndim))
