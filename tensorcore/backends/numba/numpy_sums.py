"""NumPy's float sums in NumPy's order, as jitted code, for native plans (``native_plan.py``).

A sum's last bits depend on the order of its additions, and a native plan must give
eager mode's (NumPy's) results bit for bit.  NumPy's ``add.reduce`` starts from the
identity 0 and, for a float32/float64 array:

* over a contiguous run (a whole C-contiguous array, no cast), adds its ``pairwise`` sum;
* over the leading axes of a C-contiguous array, keeping the others (a bias gradient),
  adds the rows one after the other, element by element.

``full_sum`` and ``leading_sum`` do exactly that; the tests compare them with NumPy
bit for bit over many shapes.  Compiled without fast-math, so nothing is reordered.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_BLOCK = 128  # PW_BLOCKSIZE of NumPy's pairwise summation


@njit(cache=True)
def _block(a, start, n):  # pragma: no cover (compiled)
    """NumPy's ``pairwise_sum`` of a run of at most 128 values: eight running sums."""
    if n < 8:
        res = a.dtype.type(0.0)
        for i in range(start, start + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[start], a[start + 1], a[start + 2], a[start + 3]
    r4, r5, r6, r7 = a[start + 4], a[start + 5], a[start + 6], a[start + 7]
    i = 8
    while i < n - n % 8:
        k = start + i
        r0 += a[k]
        r1 += a[k + 1]
        r2 += a[k + 2]
        r3 += a[k + 3]
        r4 += a[k + 4]
        r5 += a[k + 5]
        r6 += a[k + 6]
        r7 += a[k + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[start + i]
        i += 1
    return res


@njit(cache=True)
def pairwise(a, start, n):  # pragma: no cover (compiled)
    """NumPy's ``pairwise_sum`` of a[start:start + n] (``a`` 1-D contiguous): runs of at
    most 128 values summed by ``_block``, longer runs split in halves (a multiple of 8
    first) whose sums are added.  NumPy recurses; this walks the same tree with a stack
    (a recursive function cannot be linked into a cached caller)."""
    if n <= _BLOCK:
        return _block(a, start, n)
    starts = np.empty(64, np.int64)  # the frames: a run and how far its halves are done
    sizes = np.empty(64, np.int64)
    stage = np.zeros(64, np.int64)
    sums = np.empty(64, a.dtype)  # sums of finished runs, in order
    starts[0], sizes[0] = start, n
    depth, done = 0, 0
    while depth >= 0:
        s, m = starts[depth], sizes[depth]
        if m <= _BLOCK:
            sums[done] = _block(a, s, m)
            done += 1
            depth -= 1
            continue
        half = m // 2
        half -= half % 8
        if stage[depth] == 2:  # both halves summed: add them
            sums[done - 2] = sums[done - 2] + sums[done - 1]
            done -= 1
            depth -= 1
            continue
        stage[depth] += 1
        depth += 1
        stage[depth] = 0
        if stage[depth - 1] == 1:
            starts[depth], sizes[depth] = s, half
        else:
            starts[depth], sizes[depth] = s + half, m - half
    return sums[0]


@njit(cache=True)
def full_sum(a, out):  # pragma: no cover (compiled)
    """out[0] = the sum of the 1-D contiguous ``a``, as ``np.sum`` adds it."""
    out[0] = a.dtype.type(0.0) + pairwise(a, 0, a.size)


@njit(cache=True)
def leading_sum(a, out):  # pragma: no cover (compiled)
    """out[:] = the sum of the rows of the C-contiguous 2-D ``a``, as ``np.sum(axis=0)``
    adds them."""
    zero = a.dtype.type(0.0)
    for c in range(out.size):
        out[c] = zero
    for r in range(a.shape[0]):
        row = a[r]
        for c in range(out.size):
            out[c] += row[c]
