"""A GroupNorm (+ activation) applied inside a convolution's operand pack.

When a convolution is the one reader of a GroupNorm's result (a ResBlock's
``conv(silu(norm(x)))``; ``tc.compile`` rewrites it to ``group_norm_conv2d``), the
normalized tensor need never exist: one kernel (cuda/groupnorm_stats.cu) reads x once
for the statistics and leaves, per sample and channel, the affine map
``scale = rstd * weight``, ``beta = bias - mean * scale``; the convolution's pack kernel
(cuda/conv_igemm.cu), which reads x anyway, applies ``act((x + shift) * scale + beta)``
as it goes.  Against a GroupNorm that writes its result and a pack that reads it back,
that spares a write and a read of the whole tensor.

Compiled plans are bit-identical to eager calls on the GPU, so the fusion runs only
where it reproduces eager GroupNorm exactly: where eager would run the cluster kernel,
whose split of the statistics and arithmetic the statistics kernel and the pack repeat.
Elsewhere ``group_norm_conv2d`` makes the two calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


from . import groupnorm, loader
from .counters import arrival_counters
from .elementwise import ACT_CODES
from .util import NULL, acc_dtype, aligned, pack_width, ptr

SOURCE = "groupnorm_stats.cu"
_GRID_Y = 65535


@dataclass(frozen=True)
class GroupNormIn:
    """group_norm's arguments after x (checked by the caller): weight and bias [C] or
    None, groups, eps, act, shift [N, C] contiguous or None."""

    weight: Any
    bias: Any
    groups: int
    eps: float
    act: str
    shift: Any

    def arrays(self) -> tuple:
        return tuple(a for a in (self.weight, self.bias, self.shift) if a is not None)


def covers(x: Any, norm: GroupNormIn) -> bool:
    """Whether the pack gives what eager GroupNorm gives, bit for bit: where eager runs the
    cluster kernel (groupnorm.py: Hopper, x contiguous and 16-byte aligned, planes of
    whole packs, the cluster kernel chosen first), whose split the statistics kernel
    repeats; parameters contiguous, at most 65535 statistics."""
    n, c = x.shape[:2]
    pack = pack_width(x.dtype)
    stats, stat_packs = n * norm.groups, x.size // (n * norm.groups) // pack
    return (loader.compute_capability() >= 90 and x.flags.c_contiguous and aligned(x)
            and (x.size // (n * c)) % pack == 0 and stats <= _GRID_Y
            and all(a.flags.c_contiguous for a in norm.arrays())
            and _threads(x, norm.groups) is not None
            and groupnorm.forward_kernels(stats, stat_packs)[0] is groupnorm.clustered)


def _threads(x: Any, groups: int) -> int | None:
    """The cluster kernel's threads per block for this tensor (None: it does not run)."""
    share = -(-(x.size // (x.shape[0] * groups) // pack_width(x.dtype)) // groupnorm.CLUSTER)
    return groupnorm.cluster_threads(share)


def scratch_layout(x: Any, groups: int) -> tuple[tuple[tuple[int, ...], Any], ...]:
    """(shape, dtype) of the coefficients [2, N, C] and of the chunks' partials."""
    acc = acc_dtype(x.dtype)
    return ((2, *x.shape[:2]), acc), ((x.shape[0] * groups * groupnorm.CLUSTER * 3,), acc)


def coefficients(x: Any, norm: GroupNormIn, coef: Any, part: Any) -> None:
    """coef [2, N, C] = the per-(sample, channel) scale and beta of the GroupNorm of x."""
    n, c = x.shape[:2]
    stats = n * norm.groups
    stat_len = x.size // stats
    loader.kernel(SOURCE, "group_norm_coef_kernel", x.dtype)(
        (groupnorm.CLUSTER, stats), (_threads(x, norm.groups),),
        (x, ptr(norm.shift), ptr(norm.weight), ptr(norm.bias), part, arrival_counters(stats), coef,
         stat_len, stat_len * norm.groups // c, c, n * c, float(norm.eps)))


def pack_args(norm: GroupNormIn, coef: Any, n: int) -> tuple:
    """The normalization arguments of conv_pack_norm_kernel, after the first tensor's."""
    return coef, NULL if norm.shift is None else norm.shift, n, ACT_CODES[norm.act]
