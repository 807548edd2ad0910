"""The two-pass GroupNorm / BatchNorm kernels (cuda/planenorm.cu): x [N, C, *] seen as
N*C planes of S elements, each plane split into chunks so that the blocks fill the GPU.

``geometry`` is their launch shape and ``stats`` launches the statistics kernel, for
eager GroupNorm / BatchNorm (``nn.py``) and for a GroupNorm that a convolution applies
as it packs its input (``conv_norm.py``), which must see exactly eager's statistics;
``coefficients`` gives that convolution the per-plane scale and shift the apply kernel
would normalize with.
"""

from __future__ import annotations

import math
from typing import Any

from . import loader
from .util import NULL, aligned, pack_width, ptr

PLANE = "planenorm.cu"
THREADS = 256


def geometry(x: Any) -> tuple[int, int, int, int, bool]:
    """(N, C, S, chunks, vec) for x [N, C, *]: chunks per plane so that N*C*chunks fills
    the GPU with blocks of at least ~1024 elements; vec: 16-byte packs (S a whole number
    of them, x aligned)."""
    n, c = x.shape[:2]
    s = math.prod(x.shape[2:])
    chunks = max(1, min(-(-8 * loader.sm_count() // (n * c)), -(-s // 1024)))
    return n, c, s, chunks, s % pack_width(x.dtype) == 0 and aligned(x)


def stats(x: Any, shift: Any, part: Any, mean: Any, rstd: Any, counters: Any, cpg: int, bn: bool,
          eps: float, running_mean: Any = None, running_var: Any = None, momentum: float = 0.0) -> None:
    """mean, rstd of each statistic of contiguous x (``plane_stats_kernel``): ``part``
    holds N*C*chunks*3 Welford partials, ``counters`` one zeroed arrival counter per
    statistic; BatchNorm (``bn``) updates the running statistics when given."""
    n, c, s, chunks, vec = geometry(x)
    loader.kernel(PLANE, "plane_stats_kernel", x.dtype)(
        (n * c, chunks), (THREADS,),
        (x, ptr(shift), part, mean, rstd, ptr(running_mean), ptr(running_var), counters, s, chunks,
         c, cpg, int(bn), n, float(eps), float(momentum), int(vec)))


def coefficients(mean: Any, rstd: Any, weight: Any, bias: Any, coef: Any, dtype: Any, channels: int,
                 cpg: int) -> None:
    """coef [2, N, C] = the scale and beta ``plane_apply_kernel`` normalizes each plane of
    a GroupNorm with (``plane_coef_kernel``)."""
    planes = coef.size // 2
    loader.launch(PLANE, "plane_coef_kernel", dtype, planes,
                  (mean, rstd, NULL if weight is None else weight, NULL if bias is None else bias, coef,
                   channels, cpg, planes))
