"""Row-parallel softmax, log_softmax and cross-entropy over the last axis of [R, C].

Each row is processed by one thread while it sits in L1: a vectorised max pass, then
one pass that computes ``exp(x - max)`` and its sum together.  (A single "online"
max+sum pass rescales its sum whenever the max grows, which does not vectorise; the
separate max pass over a cached row is cheaper; ``reductions.row_max`` keeps it
vectorised.)
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from .jit import helper, kernel, wide_vectors
from .mathfn import fexp
from .reductions import row_max


@helper
def _log_sum_exp(row):
    """max(row) + log(sum(exp(row - max)))."""
    t = row.dtype.type
    m = row_max(row)
    s = t(0.0)
    for c in range(row.size):
        s += fexp(row[c] - m)
    return m + t(math.log(s))


@kernel
def softmax_rows(x):
    """softmax over the last axis of x [R, C]."""
    t = x.dtype.type
    out = np.empty_like(x)
    for r in prange(x.shape[0]):
        wide_vectors()
        row, res = x[r], out[r]
        m = row_max(row)
        s = t(0.0)
        for c in range(row.size):
            e = fexp(row[c] - m)
            res[c] = e
            s += e
        inv = t(1.0) / s
        for c in range(row.size):
            res[c] *= inv
    return out


@kernel
def softmax_rows_backward(grad, y):
    """y * (grad - sum(grad * y)) per row."""
    t = y.dtype.type
    out = np.empty_like(y)
    for r in prange(y.shape[0]):
        g, yr, res = grad[r], y[r], out[r]
        dot = t(0.0)
        for c in range(yr.size):
            dot += g[c] * yr[c]
        for c in range(yr.size):
            res[c] = yr[c] * (g[c] - dot)
    return out


@kernel
def log_softmax_rows(x):
    """x - max - log(sum(exp(x - max))) per row."""
    out = np.empty_like(x)
    for r in prange(x.shape[0]):
        wide_vectors()
        row, res = x[r], out[r]
        shift = _log_sum_exp(row)
        for c in range(row.size):
            res[c] = row[c] - shift
    return out


@kernel
def log_softmax_rows_backward(grad, y):
    """grad - exp(y) * sum(grad) per row (y is the log_softmax output)."""
    t = y.dtype.type
    out = np.empty_like(y)
    for r in prange(y.shape[0]):
        g, yr, res = grad[r], y[r], out[r]
        total = t(0.0)
        for c in range(yr.size):
            total += g[c]
        for c in range(yr.size):
            res[c] = g[c] - fexp(yr[c]) * total
    return out


@kernel
def cross_entropy_rows(logits, target, ignore_index, smoothing):
    """Per-row loss ``(1-s) * -logp[target] + s * mean(-logp)`` (0 on ignored rows)
    and log_softmax(logits)."""
    t = logits.dtype.type
    rows, classes = logits.shape
    logp = np.empty_like(logits)
    loss = np.empty(rows, dtype=logits.dtype)
    for r in prange(rows):
        wide_vectors()
        row, res = logits[r], logp[r]
        shift = _log_sum_exp(row)
        total = t(0.0)
        for c in range(classes):
            v = row[c] - shift
            res[c] = v
            total += v
        if target[r] == ignore_index:
            loss[r] = t(0.0)
        else:
            loss[r] = -((t(1.0) - t(smoothing)) * logp[r, target[r]]
                        + t(smoothing) * total / t(classes))
    return loss, logp


@kernel
def cross_entropy_rows_backward(grad_rows, logp, target, ignore_index, smoothing):
    """d logits = grad_row * (softmax - q) with q the smoothed one-hot target."""
    t = logp.dtype.type
    rows, classes = logp.shape
    out = np.empty_like(logp)
    uniform = t(smoothing) / t(classes)
    for r in prange(rows):
        if target[r] == ignore_index:
            for c in range(classes):
                out[r, c] = t(0.0)
            continue
        g, lp, res = grad_rows[r], logp[r], out[r]
        for c in range(classes):
            res[c] = g * (fexp(lp[c]) - uniform)
        out[r, target[r]] -= g * (t(1.0) - t(smoothing))
    return out
