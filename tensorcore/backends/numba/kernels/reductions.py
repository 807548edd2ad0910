"""Vectorised reductions over one contiguous 1-D row, for use inside kernels, the sums
of a kernel's per-task partial rows, and the per-channel sum of [outer, C, inner] (a
convolution's bias gradient)."""

from __future__ import annotations

import numpy as np

from .jit import helper, kernel
from .lanes import SQUARED_DEVIATION, SUM, lane_sum
from .parallel import parallel_for


_LANES = 64  # four AVX-512 registers of float32: one block's max need not wait for the last


@helper
def row_max(row):
    """max(row) of a non-empty row; NaN when the row holds one.

    LLVM does not vectorise a running ``max`` over one accumulator, so rows of 64 values
    or more keep ``_LANES`` independent maxima and fold them at the end.  With fewer
    lanes (one register) each block's ``max`` waits on the previous one.  Plain loops
    rather than ``np.maximum`` and ``ndarray.max``, whose implementations take seconds
    to compile.
    """
    n = row.size
    body = n - n % _LANES
    if body == 0:
        return _max_from(row, row[0], 1, n)
    lanes = np.empty(_LANES, dtype=row.dtype)
    for c in range(_LANES):
        lanes[c] = row[c]
    for start in range(_LANES, body, _LANES):
        for c in range(_LANES):
            v = row[start + c]
            lanes[c] = v if v > lanes[c] or v != v else lanes[c]
    return _max_from(row, _max_from(lanes, lanes[0], 1, _LANES), body, n)


@helper
def _max_from(row, m, start, stop):
    """The max of ``m`` and row[start:stop], NaN winning."""
    for c in range(start, stop):
        v = row[c]
        if v > m or v != v:
            m = v
    return m


@helper
def column_sums(partial):
    """[C] sums of partial [K, C] over its rows, in order (the per-task partial sums of
    a weight gradient).  A loop rather than ``partial.sum(axis=0)``, whose axis check
    builds its error message from strings: several seconds of compiling."""
    out = np.empty(partial.shape[1], dtype=partial.dtype)
    column_sums_into(partial, out)
    return out


@helper
def column_sums_into(partial, out):
    """``column_sums`` written into out [C]."""
    t = out.dtype.type
    for c in range(out.size):
        out[c] = t(0.0)
    for k in range(partial.shape[0]):
        row = partial[k]
        for c in range(row.size):
            out[c] += row[c]


_BLOCK = 4096


@helper
def _block_moments(block):
    """(mean, sum of squared deviations) of a short block, by two exact passes."""
    t = block.dtype.type
    mean = lane_sum(SUM, block, block, t(0.0)) / t(block.size)
    return mean, lane_sum(SQUARED_DEVIATION, block, block, mean)


@helper
def moments(seg):
    """(mean, sum of squared deviations) of a contiguous segment, in float64.

    Welford's parallel form (Chan et al.): blocks that fit in L1 get exact two-pass
    moments with vectorised loops, and the blocks are merged with the pairwise update
    ``m2 = m2_a + m2_b + delta**2 * n_a * n_b / n``, which stays accurate for long
    segments whose mean is large relative to their spread.
    """
    count = 0
    mean = 0.0
    m2 = 0.0
    for start in range(0, seg.size, _BLOCK):
        block = seg[start:start + _BLOCK]
        block_mean, block_m2 = _block_moments(block)
        n_b = block.size
        total = count + n_b
        delta = float(block_mean) - mean
        mean += delta * n_b / total
        m2 += float(block_m2) + delta * delta * count * n_b / total
        count = total
    return mean, m2


@helper
def _channel_sum(ch, x, outer, out):
    t = x.dtype.type
    total = 0.0
    for o in range(outer):
        run = x[o, ch]
        total += lane_sum(SUM, run, run, t(0.0))
    out[ch] = total


@kernel
def channel_sums(x):
    """[C] sums of x [outer, C, inner] over its outer and inner axes (an NCHW tensor's
    per-channel sums): one channel per task, each contiguous run of ``inner`` values
    summed in x's dtype with vector loops, the runs accumulated in float64."""
    outer, channels, inner = x.shape
    out = np.empty(channels, dtype=x.dtype)
    parallel_for(_channel_sum, channels, (x, outer, out))
    return out
