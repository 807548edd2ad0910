"""What the implicit-GEMM convolution runs: tile shapes, their kernel instantiations,
the choice of tile and K split per problem, and counters of which path each call took.

Pure Python (no CuPy), so the CPU CI can list every instantiation and compile it, and
``tc.cuda.conv_stats()`` works anywhere.

The choice is a small cost model rather than a lookup table: for every tile of the
dtype and every K split it estimates (waves of blocks over the GPU) x (time of one
wave at the tile's relative efficiency) plus, for a split, the float32 partials written
and summed again, and keeps the cheapest.  Large-channel, large-image convolutions take
the 128 x 128 tile unsplit; batch-1 deep layers (few output tiles, long K) split K.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterator

SOURCE = "conv_igemm.cu"
FPROP, WGRAD = "conv_fprop_kernel", "conv_wgrad_kernel"
# the kernels of FPROP's and WGRAD's tiles on Hopper's warpgroup MMA
WGMMA_KERNELS = {FPROP: "conv_fprop_wgmma_kernel", WGRAD: "conv_wgrad_wgmma_kernel"}

# precisions: the kernels' PREC template argument
PREC_16, PREC_TF32, PREC_3XTF32 = 0, 1, 2
# (C storage type, precision) pairs the kernels are instantiated for
VARIANTS = (("float", PREC_TF32), ("float", PREC_3XTF32), ("half_t", PREC_16),
            ("bf16_t", PREC_16))


@dataclass(frozen=True, kw_only=True)
class Tile:
    """A block tile BM x BN x BK (elements), WM x WN warps, STAGES copies in flight,
    registers capped for ``min_blocks`` blocks per SM (its launch bounds: chosen from
    ptxas' report so that no tile spills).  ``efficiency`` is its throughput relative
    to the best tile, for the cost model."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int
    min_blocks: int
    efficiency: float
    wgmma: bool = False  # run by a WGMMA_KERNELS kernel: warps_m = BM / 16, warps_n = 1
    # wgmma tiles: K tiles copied ahead of the one multiplied, None for stages - 2 (one
    # wgmma group left in flight behind it); stages - 1 waits for each group instead; 0
    # copies on a warpgroup of its own, a stage refilled as soon as it has been multiplied
    lookahead: int | None = None

    @property
    def ahead(self) -> int:
        return self.stages - 2 if self.lookahead is None else self.lookahead

    @property
    def producer(self) -> bool:
        """Whether a warpgroup of its own copies the tiles (wgmma, lookahead 0)."""
        return self.wgmma and self.ahead == 0

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n + (128 if self.producer else 0)

    def smem_bytes(self, kernel: str, itemsize: int) -> int:
        """Dynamic shared memory of one block: STAGES A and B tiles, rows padded (or
        128-byte swizzled rows from a 1024-byte boundary for wgmma, then two 8-byte
        barriers per stage with a producer warpgroup)."""
        if self.wgmma:
            return self.stages * (self.bm + self.bn) * 128 + 1024 + (16 * self.stages if self.producer else 0)
        if kernel == FPROP:  # [rows][BK + 16 bytes]
            return self.stages * (self.bm + self.bn) * (self.bk + 16 // itemsize) * itemsize
        return self.stages * self.bk * (self.bm + self.bn + 16) * itemsize  # [BK][rows + 8]

    def blocks_per_sm(self, kernel: str, itemsize: int, smem_per_sm: int = 228 * 1024) -> int:
        """Resident blocks per SM, by shared memory (1 KiB reserved per block) and
        registers."""
        by_smem = smem_per_sm // (self.smem_bytes(kernel, itemsize) + 1024)
        return max(1, min(by_smem, self.min_blocks))

    def expression(self, kernel: str, ctype: str, prec: int) -> str:
        if self.wgmma:
            return (f"{WGMMA_KERNELS[kernel]}<{ctype}, {prec}, {self.bm}, {self.bn}, {self.stages}, "
                    f"{self.ahead}>")
        return (f"{kernel}<{ctype}, {prec}, {self.bm}, {self.bn}, {self.bk}, {self.warps_m}, "
                f"{self.warps_n}, {self.stages}, {self.min_blocks}>")


# forward / input gradient: rows are output pixels, columns output channels.  Eight
# warps of 32 x 64 or 64 x 32 where registers allow (two warps per scheduler hide the
# barrier and fragment loads); efficiencies fitted to a sweep of every tile and split
# over the reference UNet's convolutions (docs/benchmarks.md#convolution-tile-plans).
_FPROP_TILES = {
    PREC_TF32: (
        Tile(bm=256, bn=128, bk=32, warps_m=4, warps_n=2, stages=3, min_blocks=1, efficiency=1.0),
        Tile(bm=128, bn=128, bk=32, warps_m=4, warps_n=2, stages=4, min_blocks=1, efficiency=0.8),
        Tile(bm=128, bn=128, bk=16, warps_m=2, warps_n=2, stages=4, min_blocks=2, efficiency=0.7),
        Tile(bm=128, bn=32, bk=32, warps_m=4, warps_n=1, stages=4, min_blocks=2, efficiency=0.3),
    ),
    # 3xTF32 holds both TF32 parts of every fragment: 64 x 32 warp tiles
    PREC_3XTF32: (
        Tile(bm=128, bn=128, bk=32, warps_m=2, warps_n=4, stages=3, min_blocks=1, efficiency=1.0),
        Tile(bm=64, bn=64, bk=32, warps_m=2, warps_n=2, stages=4, min_blocks=3, efficiency=0.7),
        Tile(bm=128, bn=32, bk=32, warps_m=4, warps_n=1, stages=4, min_blocks=2, efficiency=0.6),
    ),
    PREC_16: (
        Tile(bm=256, bn=128, bk=64, warps_m=4, warps_n=2, stages=3, min_blocks=1, efficiency=1.0),
        Tile(bm=128, bn=128, bk=64, warps_m=2, warps_n=4, stages=3, min_blocks=1, efficiency=0.8),
        Tile(bm=128, bn=128, bk=32, warps_m=2, warps_n=2, stages=4, min_blocks=2, efficiency=0.7),
        Tile(bm=64, bn=64, bk=64, warps_m=2, warps_n=2, stages=4, min_blocks=3, efficiency=0.6),
        Tile(bm=128, bn=32, bk=64, warps_m=4, warps_n=1, stages=4, min_blocks=2, efficiency=0.4),
    ),
}
# on sm_90: wgmma tiles of BM / 64 warpgroups and K tiles of 128 bytes (BK elements), for
# the weight gradient (stride 1, dilation 1; the others take _WGRAD_TILES) as they are,
# for the forward / input gradient with the mma.sync kernel's narrowest tile added for a
# few output channels (a UNet's or VAE's last convolution), where it is faster
_WGMMA_WGRAD_TILES = {
    prec: (
        Tile(bm=128, bn=256, bk=bk, warps_m=8, warps_n=1, stages=4, min_blocks=1, efficiency=1.0, wgmma=True),
        Tile(bm=256, bn=128, bk=bk, warps_m=16, warps_n=1, stages=4, min_blocks=1, efficiency=1.0, wgmma=True),
        Tile(bm=128, bn=128, bk=bk, warps_m=8, warps_n=1, stages=3, min_blocks=2, efficiency=0.9, wgmma=True),
        Tile(bm=64, bn=128, bk=bk, warps_m=4, warps_n=1, stages=4, min_blocks=2, efficiency=0.7, wgmma=True),
    )
    for prec, bk in ((PREC_TF32, 32), (PREC_16, 64))
}
# the narrow tile's efficiency beside them: in 16 bits, walking K with the taps inside,
# it ran at 0.31-0.45 of the best wgmma tile's rate on the SD VAE's 3x3 convolutions
# (docs/benchmarks.md, the tile sweep)
_NARROW_EFFICIENCY = {PREC_TF32: 0.25, PREC_16: 0.35}
# and a tile 160 wide: the SD UNets' 320, 640 and 1280 channels are whole multiples of it
# (on 128 x 256 a 320-channel output leaves 192 of 512 columns idle), with five stages
# (its 36 KB stages leave room for one more); its efficiency, below the others' until a
# sweep fits it, gives it only the outputs where the wider tiles would idle columns
_WGMMA_FPROP_TILES = {
    prec: wgmma + (Tile(bm=128, bn=160, bk=_WGMMA_WGRAD_TILES[prec][0].bk, warps_m=8, warps_n=1, stages=5,
                        min_blocks=1, efficiency=0.8, wgmma=True),
                   dataclasses.replace(_FPROP_TILES[prec][-1], efficiency=_NARROW_EFFICIENCY[prec]))
    for prec, wgmma in _WGMMA_WGRAD_TILES.items()
}
# weight gradient: rows are output channels, columns (tap, input channel), K the pixels
_WGRAD_TILES = {
    PREC_TF32: (
        Tile(bm=128, bn=128, bk=32, warps_m=2, warps_n=4, stages=3, min_blocks=2, efficiency=1.0),
        Tile(bm=64, bn=64, bk=32, warps_m=2, warps_n=2, stages=4, min_blocks=3, efficiency=0.6),
    ),
    PREC_3XTF32: (
        Tile(bm=128, bn=128, bk=32, warps_m=2, warps_n=4, stages=3, min_blocks=1, efficiency=1.0),
        Tile(bm=64, bn=64, bk=32, warps_m=2, warps_n=2, stages=4, min_blocks=3, efficiency=0.6),
    ),
    PREC_16: (
        Tile(bm=128, bn=128, bk=32, warps_m=2, warps_n=4, stages=3, min_blocks=2, efficiency=1.0),
        Tile(bm=64, bn=64, bk=32, warps_m=2, warps_n=2, stages=4, min_blocks=3, efficiency=0.6),
    ),
}


def tiles(kernel: str, prec: int, wgmma: bool = False) -> tuple[Tile, ...]:
    """The tiles of a kernel and precision; ``wgmma``: on a GPU with warpgroup MMA
    (sm_90), where the TF32 and 16-bit tiles run on it (the weight gradient's for
    stride 1 and dilation 1)."""
    wgmma_tiles = _WGMMA_FPROP_TILES if kernel == FPROP else _WGMMA_WGRAD_TILES
    if wgmma and prec in wgmma_tiles:
        return wgmma_tiles[prec]
    return (_FPROP_TILES if kernel == FPROP else _WGRAD_TILES)[prec]


def instances() -> list[str]:
    """Every kernel instantiation the host code may launch."""
    return list(dict.fromkeys(
        tile.expression(kernel, ctype, prec) for ctype, prec in VARIANTS
        for kernel in (FPROP, WGRAD) for wgmma in (False, True)
        for tile in tiles(kernel, prec, wgmma)))


# ----- the cost model -------------------------------------------------------------------
# sustained mma.sync rates of the whole GPU (FLOP/s) and copy bandwidth (B/s): only their
# ratios matter, they weigh tensor-core time against the split-K partials' traffic
_RATE = {PREC_16: 600e12, PREC_TF32: 300e12, PREC_3XTF32: 100e12}
_BANDWIDTH = 3.0e12
_LAUNCH_S = 3e-6  # the reduce kernel's launch and tail
MAX_SPLITS = 128
_MIN_K_TILES_PER_SPLIT = 4
_WORKSPACE_LIMIT = 64 * 2**20  # bytes of float32 partials a split may use


@dataclass(frozen=True)
class Plan:
    """A tile, its K split and (the forward) the order K is walked in: ``taps_inner``,
    each K tile's channels through every tap before the next channels, where the padded
    channels fill whole K tiles (the kernels then read a block's shifted windows from L1).
    None (the default) takes it for the ``mma.sync`` tiles (the SD VAE's 3x3 convolutions
    on the 128 x 32 tile: 18-23% less time on an H100) and not for the ``wgmma`` ones,
    whose four 48 KB stages leave L1 little room (within 3% either way, mostly slower)."""

    tile: Tile
    splits: int
    taps_inner: bool | None = None

    @property
    def walks_taps_inner(self) -> bool:
        return not self.tile.wgmma if self.taps_inner is None else self.taps_inner


_forced: dict[str, Plan] = {}
last: dict[str, Plan] = {}  # the plan of the latest call per kernel (benchmarks print it)


@contextlib.contextmanager
def forced(kernel: str, plan: Plan) -> Iterator[None]:
    """Run ``kernel`` (FPROP or WGRAD) with ``plan`` inside the block, whatever the cost
    model says (benchmarks compare tiles with it)."""
    _forced[kernel] = plan
    try:
        yield
    finally:
        del _forced[kernel]


def is_forced(kernel: str) -> bool:
    """Whether a plan is forced for ``kernel`` (the forward then runs its GEMM even where
    a kernel of its own would take the call)."""
    return kernel in _forced


def choose(kernel: str, prec: int, itemsize: int, m: int, n: int, k: int, phases: int,
           out_elems: int, sms: int, wgmma: bool = False) -> Plan:
    """The tile and K split for a GEMM of m x n outputs (per phase) over k, repeated
    over ``phases`` (the strided input gradient's output phases), on a GPU with
    (``wgmma``) or without warpgroup MMA.  A forced plan applies where its kernel runs
    the call: any forward tile; a weight-gradient tile of the kind asked for."""
    plan = _forced.get(kernel)
    if plan is None or (kernel == WGRAD and plan.tile.wgmma != wgmma):
        plan = _cheapest(kernel, prec, itemsize, m, n, k, phases, out_elems, sms, wgmma)
    last[kernel] = plan
    return plan


@functools.lru_cache(maxsize=4096)
def _cheapest(kernel: str, prec: int, itemsize: int, m: int, n: int, k: int, phases: int,
              out_elems: int, sms: int, wgmma: bool) -> Plan:
    best, best_time = None, math.inf
    for tile in tiles(kernel, prec, wgmma):
        k_tiles = max(1, math.ceil(k / tile.bk))
        blocks = math.ceil(m / tile.bm) * math.ceil(n / tile.bn) * phases
        slots = sms * tile.blocks_per_sm(kernel, itemsize)
        sm_rate = _RATE[prec] / sms * tile.efficiency
        for splits in range(1, MAX_SPLITS + 1):
            if splits > 1 and (k_tiles < _MIN_K_TILES_PER_SPLIT * splits
                               or 4 * out_elems * splits > _WORKSPACE_LIMIT):
                break
            # a block's K tiles plus about two more for its pipeline fill and epilogue
            per_block = 2.0 * tile.bm * tile.bn * tile.bk * (math.ceil(k_tiles / splits) + 2)
            waves = math.ceil(blocks * splits / slots)
            time = waves * per_block * (slots / sms) / sm_rate
            if splits > 1:
                time += (4.0 * out_elems * (splits + 1)) / _BANDWIDTH + _LAUNCH_S
            if time < best_time:
                best, best_time = Plan(tile=tile, splits=splits), time
    return best


# ----- counters ---------------------------------------------------------------------------
_counts: dict[str, Counter] = {"implicit_gemm": Counter(), "fallback": Counter()}


def record(path: str, what: str) -> None:
    """Count one call: ``path`` "implicit_gemm" with the op, or "fallback" with
    "op: reason"."""
    _counts[path][what] += 1


def stats() -> dict[str, dict[str, int]]:
    return {path: dict(counter) for path, counter in _counts.items()}


def reset_stats() -> None:
    for counter in _counts.values():
        counter.clear()
