"""A GroupNorm (+ activation) applied inside a convolution's operand pack.

When a convolution is the one reader of a GroupNorm's result (a ResBlock's
``conv(silu(norm(x)))``; ``tc.compile`` rewrites it to ``group_norm_conv2d``), the
normalized tensor need never exist: one kernel (cuda/groupnorm_stats.cu) reads x once
for the statistics and leaves, per sample and channel, the affine map
``scale = rstd * weight``, ``beta = bias - mean * scale``; the convolution's pack kernel
(cuda/conv_igemm.cu), which reads x anyway, applies ``act((x + shift) * scale + beta)``
as it goes.  Against a GroupNorm that writes its result and a pack that reads it back,
that spares a write and a read of the whole tensor.

Compiled plans are bit-identical to eager calls on the GPU, so the statistics are
always the ones eager GroupNorm would compute, by the kernel it would run: for the
one-pass cluster kernel the statistics kernel repeats its split and arithmetic; the
one-pass resident kernel itself stops after its statistics and writes the coefficients;
for the two-pass kernels (large planes: a VAE decoder's at 256² and 512², and every
GroupNorm before Hopper) eager's own statistics kernel runs, and ``plane_coef_kernel``
turns them into the apply kernel's coefficients (``planes.py``).  The pack then computes
each value as those kernels do.  x must be contiguous, 16-byte aligned and of planes
of whole packs; elsewhere ``group_norm_conv2d`` makes the two calls.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from . import groupnorm, loader, planes
from .counters import arrival_counters
from .elementwise import ACT_CODES
from .util import NULL, acc_dtype, aligned, pack_width, ptr

SOURCE = "groupnorm_stats.cu"
_GRID_Y = 65535


@dataclass(frozen=True)
class GroupNormIn:
    """group_norm's arguments after x (checked by the caller): weight and bias [C] or
    None, groups, eps, act, shift [N, C] contiguous or None; ``kernel``: the one-pass
    kernel eager GroupNorm runs on x and its launch shape (``groupnorm.one_pass_choice``),
    set by ``covered``."""

    weight: Any
    bias: Any
    groups: int
    eps: float
    act: str
    shift: Any
    kernel: tuple = ()  # ("cluster", threads), ("resident", layout) or ("plane", None)

    def arrays(self) -> tuple:
        return tuple(a for a in (self.weight, self.bias, self.shift) if a is not None)


def covered(x: Any, norm: GroupNormIn) -> GroupNormIn | None:
    """``norm`` with the kernel eager GroupNorm runs on x (groupnorm.py: a one-pass
    kernel on Hopper where one applies, else the two-pass ones), whose statistics the
    coefficients repeat, when x is contiguous, 16-byte aligned and of planes of whole
    packs, the parameters contiguous, at most 65535 statistics.  Else None."""
    n, c = x.shape[:2]
    if not (x.flags.c_contiguous and aligned(x) and (x.size // (n * c)) % pack_width(x.dtype) == 0
            and n * norm.groups <= _GRID_Y and all(a.flags.c_contiguous for a in norm.arrays())):
        return None
    choice = None
    if loader.compute_capability() >= 90:
        choice = groupnorm.one_pass_choice(x, n * norm.groups, x.size // (n * norm.groups))
    return replace(norm, kernel=choice or ("plane", None))


def scratch_layout(x: Any, norm: GroupNormIn) -> tuple[tuple[tuple[int, ...], Any], ...]:
    """(shape, dtype) of the coefficients [2, N, C] and of the statistics' scratch: the
    one-pass kernels' partials, or the two-pass kernel's partials, then mean and rstd."""
    acc = acc_dtype(x.dtype)
    kind, shape = norm.kernel
    stats = x.shape[0] * norm.groups
    if kind == "cluster":
        parts = stats * groupnorm.CLUSTER * 3
    elif kind == "resident":
        parts = shape[0] * groupnorm.RES_STATS * 2
    else:
        n, c, _, chunks, _ = planes.geometry(x)
        parts = n * c * chunks * 3 + 2 * stats
    return ((2, *x.shape[:2]), acc), ((parts,), acc)


def coefficients(x: Any, norm: GroupNormIn, coef: Any, part: Any) -> None:
    """coef [2, N, C] = the per-(sample, channel) scale and beta of the GroupNorm of x,
    the numbers eager's kernel normalizes with: its own statistics (the resident kernel
    stopping short of the output; the two-pass statistics kernel, then plane_coef_kernel),
    or the cluster kernel's repeated by group_norm_coef_kernel."""
    n, c = x.shape[:2]
    stats = n * norm.groups
    stat_len = x.size // stats
    kind, shape = norm.kernel
    if kind == "plane":
        mean, rstd = part[part.size - 2 * stats:].reshape(2, stats)
        planes.stats(x, norm.shift, part[:part.size - 2 * stats], mean, rstd, arrival_counters(stats),
                     c // norm.groups, False, norm.eps)
        planes.coefficients(mean, rstd, norm.weight, norm.bias, coef, x.dtype, c, c // norm.groups)
        return
    if kind == "resident":
        groupnorm.run_resident(x, norm.shift, norm.weight, norm.bias, stat_len, norm.eps, norm.act,
                               shape, part, (NULL, NULL, NULL, coef))
        return
    loader.kernel(SOURCE, "group_norm_coef_kernel", x.dtype)(
        (groupnorm.CLUSTER, stats), (shape,),
        (x, ptr(norm.shift), ptr(norm.weight), ptr(norm.bias), part, arrival_counters(stats), coef,
         stat_len, stat_len * norm.groups // c, c, n * c, float(norm.eps)))


def pack_args(norm: GroupNormIn, coef: Any, n: int) -> tuple:
    """The normalization arguments of conv_pack_norm_kernel, after the first tensor's."""
    return coef, NULL if norm.shift is None else norm.shift, n, ACT_CODES[norm.act]
