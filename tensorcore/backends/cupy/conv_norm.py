"""A GroupNorm (+ activation) applied inside a convolution's operand pack.

When a convolution is the one reader of a GroupNorm's result (a ResBlock's
``conv(silu(norm(x)))``; ``tc.compile`` rewrites it to ``group_norm_conv2d``), the
normalized tensor need never exist: one kernel (cuda/groupnorm_stats.cu) reads x once
for the statistics and leaves, per sample and channel, the affine map
``scale = rstd * weight``, ``beta = bias - mean * scale``; the convolution's pack kernel
(cuda/conv_igemm.cu), which reads x anyway, applies ``act((x + shift) * scale + beta)``
as it goes.  Against a GroupNorm that writes its result and a pack that reads it back,
that spares a write and a read of the whole tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


from . import loader
from .counters import arrival_counters
from .elementwise import ACT_CODES
from .util import NULL, acc_dtype, aligned, pack_width, ptr

SOURCE = "groupnorm_stats.cu"
STATS_THREADS, STATS_PACKS = 256, 4  # per block, per thread (groupnorm_stats.cu)
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
    """Whether the statistics kernel reads x: C-contiguous, 16-byte aligned, every
    statistic a whole number of 16-byte packs (and, with a shift, which is per plane,
    every plane), at most 65535 statistics; the parameters contiguous."""
    n, c = x.shape[:2]
    pack = pack_width(x.dtype)
    unit = x.size // (n * c) if norm.shift is not None else x.size // (n * norm.groups)
    return (x.flags.c_contiguous and aligned(x) and unit % pack == 0
            and n * norm.groups <= _GRID_Y
            and all(a.flags.c_contiguous for a in norm.arrays()))


def chunks(x: Any, groups: int) -> int:
    """Blocks per statistic: enough that a block's threads hold at most STATS_PACKS packs
    each, and about two blocks per SM overall while every thread still gets a pack."""
    stats = x.shape[0] * groups
    packs = x.size // stats // pack_width(x.dtype)
    fill = min(-(-2 * loader.sm_count() // stats), -(-packs // STATS_THREADS))
    return max(-(-packs // (STATS_THREADS * STATS_PACKS)), fill, 1)


def scratch_layout(x: Any, groups: int) -> tuple[tuple[tuple[int, ...], Any], ...]:
    """(shape, dtype) of the coefficients [2, N, C] and of the chunks' partials."""
    acc = acc_dtype(x.dtype)
    return ((2, *x.shape[:2]), acc), ((x.shape[0] * groups * chunks(x, groups) * 3,), acc)


def coefficients(x: Any, norm: GroupNormIn, coef: Any, part: Any) -> None:
    """coef [2, N, C] = the per-(sample, channel) scale and beta of the GroupNorm of x."""
    n, c = x.shape[:2]
    stats = n * norm.groups
    stat_len = x.size // stats
    loader.kernel(SOURCE, "group_norm_coef_kernel", x.dtype)(
        (chunks(x, norm.groups), stats), (STATS_THREADS,),
        (x, ptr(norm.shift), ptr(norm.weight), ptr(norm.bias), part, arrival_counters(stats), coef,
         stat_len, stat_len * norm.groups // c, c, n * c, float(norm.eps)))


def pack_args(norm: GroupNormIn, coef: Any, n: int) -> tuple:
    """The normalization arguments of conv_pack_norm_kernel, after the first tensor's."""
    return coef, NULL if norm.shift is None else norm.shift, n, ACT_CODES[norm.act]
