"""One-pass GroupNorm forward on Hopper: x is read once and y written once.

Two kernels:

* ``cuda/groupnorm_cluster.cu``: a cluster of blocks per statistic, each holding a
  slice in registers, for groups of up to 64 Ki elements (float32);
* ``cuda/groupnorm_resident.cu``: one block per SM holds its range of the whole tensor
  in registers and shared memory, one grid barrier separates the reads of the tensor
  from the writes, for any group size as long as the tensor fits on chip (~38 MB of
  float32 on an H100/H200).

``forward_kernels`` (below) is the choice between them; ``one_pass_group_norm``
returns None before Hopper, for unaligned data and for planes that are not whole packs,
and the caller then takes the two-pass path (cuda/planenorm.cu).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import cupy
import numpy

from . import loader
from .. import report
from .loader import kernel
from .elementwise import ACT_CODES
from .util import NULL, acc_dtype, aligned, contiguous, empty_as, pack_width, ptr

GN_CLUSTER, GN_RESIDENT = "groupnorm_cluster.cu", "groupnorm_resident.cu"
# blocks per statistic, packs per thread, and threads resident per SM under the kernel's
# register cap, __launch_bounds__(512, 3) (groupnorm_cluster.cu)
CLUSTER, GN_PACKS, CLUSTER_THREADS_PER_SM = 8, 4, 1536
# threads per block, packs per thread in registers and (at most) in shared memory,
# statistics one block may touch, and a bound on the static shared memory of every
# instantiation (groupnorm_resident.cu)
RES_THREADS, RES_REG_PACKS, RES_SHARED_PACKS, RES_STATS = 1024, 4, 13, 4
RES_STATIC_SHARED = 4096
PACK_BYTES = 16


# ----- which one-pass kernel --------------------------------------------------------------
def forward_kernels(stats: int, stat_packs: int) -> tuple[Callable, ...]:
    """The one-pass kernels to try, in order, for ``stats`` statistics of ``stat_packs``
    packs each (each kernel returns None where it does not apply): the cluster kernel
    first when its blocks are at least three quarters full or all of them fit on the GPU
    at once; otherwise it would run waves of partly idle load-reduce-store blocks, and the
    resident kernel, whose single wave streams the whole tensor, goes first
    (tests/benchmarks/groupnorm_onepass.py compares them)."""
    share = -(-stat_packs // CLUSTER)
    threads = cluster_threads(share)
    if threads is not None:
        full = 4 * share >= 3 * threads * GN_PACKS
        one_wave = stats * CLUSTER <= loader.sm_count() * (CLUSTER_THREADS_PER_SM // threads)
        if full or one_wave:
            return clustered, _resident
    return _resident, clustered


def cluster_threads(share: int) -> int | None:
    """Threads per cluster block holding ``share`` packs, None when none can."""
    return next((t for t in (256, 512) if share <= t * GN_PACKS), None)


def one_pass_group_norm(x, weight, bias, groups: int, eps: float, act: str, shift=None):
    """(y, mean, rstd) of GroupNorm in one read of x, or None where no one-pass kernel
    applies.  x, weight, bias and the contiguous [N, C] ``shift`` (added to x first,
    None for none) are checked by the caller."""
    if loader.compute_capability() < 90:
        return None
    x = contiguous(x)
    weight = None if weight is None else contiguous(weight)
    bias = None if bias is None else contiguous(bias)
    n, c = x.shape[:2]
    s = x.size // (n * c)
    pack = pack_width(x.dtype)
    if s % pack or not aligned(x):
        return None
    stat_len = c // groups * s
    choice = one_pass_choice(x, n * groups, stat_len)
    if choice is None:
        return None
    run = clustered if choice[0] == "cluster" else _resident
    return run(x, shift, weight, bias, (n, groups), stat_len, s, eps, act)


def one_pass_choice(x, stats: int, stat_len: int) -> tuple[str, Any] | None:
    """The one-pass kernel that runs on x (contiguous, aligned, planes of whole packs):
    the first of ``forward_kernels`` that applies, with its launch shape, ("cluster",
    threads per block) or ("resident", ``resident_layout``); None when neither does."""
    stat_packs = stat_len // pack_width(x.dtype)
    for run in forward_kernels(stats, stat_packs):
        if run is clustered:
            threads = cluster_threads(-(-stat_packs // CLUSTER))
            if threads is not None:
                return "cluster", threads
        else:
            layout = resident_layout(x, stat_len)
            if layout is not None:
                return "resident", layout
    return None


def _outputs(x, stats: tuple[int, int]):
    y = empty_as(x)
    mean, rstd = cupy.empty((2, *stats), dtype=acc_dtype(x.dtype))
    return y, mean, rstd


def _resident(x, shift, weight, bias, stats, stat_len: int, s: int, eps: float, act: str):
    """groupnorm_resident.cu: the whole tensor on chip, or None when it does not fit
    (then it has far fewer than 2**31 elements: the kernel's indices are 32-bit)."""
    layout = resident_layout(x, stat_len)
    if layout is None:
        return None
    y, mean, rstd = _outputs(x, stats)
    partials = cupy.empty(layout[0] * RES_STATS * 2, dtype=mean.dtype)
    run_resident(x, shift, weight, bias, stat_len, eps, act, layout, partials, (y, mean, rstd, NULL))
    return y, mean, rstd


def resident_layout(x, stat_len: int) -> tuple[int, int, int] | None:
    """(grid, packs per block, packs per thread in shared memory) of the resident kernel
    for x, or None when x does not fit on chip."""
    packs = x.size // pack_width(x.dtype)
    stat_packs = stat_len // pack_width(x.dtype)
    per_block = RES_THREADS * (RES_REG_PACKS + _resident_shared_packs())
    # enough blocks for the packs (registers first) and for at most RES_STATS
    # statistics per block, no more than one per SM
    grid = max(-(-packs // (RES_THREADS * RES_REG_PACKS)),
               -(-packs // ((RES_STATS - 1) * stat_packs)))
    grid = min(grid, loader.sm_count())
    chunk = -(-packs // grid)
    if chunk > per_block or chunk > (RES_STATS - 1) * stat_packs:
        return None
    return -(-packs // chunk), chunk, max(0, -(-chunk // RES_THREADS) - RES_REG_PACKS)


def run_resident(x, shift, weight, bias, stat_len: int, eps: float, act: str,
                 layout: tuple[int, int, int], partials, outputs: tuple) -> None:
    """Launch the resident kernel on ``layout``; ``outputs`` = (y, mean, rstd, coef), the
    unused ones null: (y, mean, rstd) normalizes, coef ([2, N, C]) takes the scale and
    beta of every channel instead."""
    grid, chunk, smem_packs = layout
    if report.active:
        report.note_kernel("group_norm_resident_kernel")
    _resident_kernel(x.dtype, cupy.cuda.runtime.getDevice())(
        (grid,), (RES_THREADS,),
        (x, ptr(shift), ptr(weight), ptr(bias), *outputs[:3], partials, outputs[3],
         *map(numpy.int32, (x.size // pack_width(x.dtype), chunk, stat_len, x.size // (x.shape[0] * x.shape[1]),
                            x.shape[1])), float(eps), numpy.int32(ACT_CODES[act])),
        shared_mem=smem_packs * RES_THREADS * PACK_BYTES, enable_cooperative_groups=True)


def _resident_shared_packs() -> int:
    """Packs per thread the resident kernel can keep in dynamic shared memory."""
    fits = (loader.shared_memory_optin() - RES_STATIC_SHARED) // (RES_THREADS * PACK_BYTES)
    return min(RES_SHARED_PACKS, fits)


@functools.lru_cache(maxsize=None)
def _resident_kernel(dtype: Any, device: int) -> Any:
    """The resident kernel for ``dtype``, allowed all the shared memory it may use."""
    raw = loader.raw_kernel(GN_RESIDENT, "group_norm_resident_kernel", dtype)
    raw.max_dynamic_shared_size_bytes = (_resident_shared_packs() * RES_THREADS * PACK_BYTES)
    return raw.kernel


def clustered(x, shift, weight, bias, stats, stat_len: int, s: int, eps: float, act: str):
    """groupnorm_cluster.cu, or None for groups too large for a cluster's registers."""
    threads = cluster_threads(-(-(stat_len // pack_width(x.dtype)) // CLUSTER))
    if threads is None:
        return None
    y, mean, rstd = _outputs(x, stats)
    kernel(GN_CLUSTER, "group_norm_cluster_kernel", x.dtype)(
        (stats[0] * stats[1] * CLUSTER,), (threads,),
        (x, ptr(shift), ptr(weight), ptr(bias), y, mean, rstd, stat_len, s, x.shape[1], float(eps),
         ACT_CODES[act]))
    return y, mean, rstd
