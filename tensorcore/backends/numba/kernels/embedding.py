"""Embedding backward as a race-free scatter-add.

The flat indices are sorted once (stable, so sums run in input order and results are
deterministic); each task then owns one distinct index and adds up its rows alone.
"""

from __future__ import annotations

import numpy as np

from .jit import helper, kernel
from .parallel import parallel_for


@helper
def _scatter_run(r, grad, order, sorted_index, starts, runs, out):
    """Add the rows of run ``r`` (one distinct index) into its row of ``out``."""
    first = starts[r]
    last = starts[r + 1] if r + 1 < runs else order.size
    dst = out[sorted_index[first]]
    for k in range(first, last):
        dst += grad[order[k]]


@kernel
def scatter_rows(grad, order, sorted_index, starts, num_rows):
    """out[sorted_index[k]] += grad[order[k]] for every k, one distinct index per task.

    ``starts`` holds the first position of each run of equal ``sorted_index`` values."""
    out = np.zeros((num_rows, grad.shape[1]), dtype=grad.dtype)
    runs = starts.size
    parallel_for(_scatter_run, runs, (grad, order, sorted_index, starts, runs, out))
    return out
