"""Row-parallel softmax, log_softmax and cross-entropy over the last axis of [R, C].

Each row is processed by one thread while it sits in L1: a vectorised max pass, then
one pass that computes ``exp(x - max)`` and its sum together.  (A single "online"
max+sum pass rescales its sum whenever the max grows, which does not vectorise; the
separate max pass over a cached row is cheaper; ``reductions.row_max`` keeps it
vectorised.)

A row holding +inf or NaN, or only -inf, has no finite normaliser: its softmax and
log_softmax are NaN throughout, as in PyTorch.  The float32 ``fexp`` takes NaN to inf,
so the check is on the sum, which lies in [1, C] for every other row.
"""

from __future__ import annotations

import math

import numpy as np
from .jit import helper, inlined, kernel, wide_vectors
from .lanes import DOT, SUM, lane_sum
from .mathfn import fexp
from .parallel import parallel_for
from .reductions import row_max


@helper
def _log_sum_exp(row, scratch):
    """max(row) + log(sum(exp(row - max))); ``scratch``, a row as long, is overwritten."""
    t = row.dtype.type
    m = row_max(row)
    for c in range(row.size):
        scratch[c] = fexp(row[c] - m)
    s = lane_sum(SUM, scratch, scratch, t(0.0))
    return m + t(math.log(s)) if s < t(np.inf) else t(np.nan)


@helper
def _softmax_row(r, x, out):
    wide_vectors()
    t = x.dtype.type
    row, res = x[r], out[r]
    m = row_max(row)
    for c in range(row.size):
        res[c] = fexp(row[c] - m)
    s = lane_sum(SUM, res, res, t(0.0))
    inv = t(1.0) / s if s < t(np.inf) else t(np.nan)
    for c in range(row.size):
        res[c] *= inv


@kernel
def softmax_rows(x):
    """softmax over the last axis of x [R, C]."""
    out = np.empty_like(x)
    parallel_for(_softmax_row, x.shape[0], (x, out))
    return out


@helper
def _softmax_row_backward(r, grad, y, out):
    t = y.dtype.type
    g, yr, res = grad[r], y[r], out[r]
    dot = lane_sum(DOT, g, yr, t(0.0))
    for c in range(yr.size):
        res[c] = yr[c] * (g[c] - dot)


@kernel
def softmax_rows_backward(grad, y):
    """y * (grad - sum(grad * y)) per row."""
    out = np.empty_like(y)
    parallel_for(_softmax_row_backward, y.shape[0], (grad, y, out))
    return out


@helper
def _log_softmax_row(r, x, out):
    wide_vectors()
    row, res = x[r], out[r]
    shift = _log_sum_exp(row, res)
    for c in range(row.size):
        res[c] = row[c] - shift


@kernel
def log_softmax_rows(x):
    """x - max - log(sum(exp(x - max))) per row."""
    out = np.empty_like(x)
    parallel_for(_log_softmax_row, x.shape[0], (x, out))
    return out


@helper
def _log_softmax_row_backward(r, grad, y, out):
    t = y.dtype.type
    g, yr, res = grad[r], y[r], out[r]
    total = lane_sum(SUM, g, g, t(0.0))
    for c in range(yr.size):
        res[c] = g[c] - fexp(yr[c]) * total


@kernel
def log_softmax_rows_backward(grad, y):
    """grad - exp(y) * sum(grad) per row (y is the log_softmax output)."""
    out = np.empty_like(y)
    parallel_for(_log_softmax_row_backward, y.shape[0], (grad, y, out))
    return out


@inlined
def _row_loss(row, res, target, ignore_index, smoothing):
    """Write log_softmax(row) into ``res``; return the row's loss
    ``(1-s) * -logp[target] + s * mean(-logp)`` (0 when ``target`` is ignored)."""
    t = row.dtype.type
    shift = _log_sum_exp(row, res)
    for c in range(row.size):
        res[c] = row[c] - shift
    total = lane_sum(SUM, res, res, t(0.0))
    if target == ignore_index:
        return t(0.0)
    return -((t(1.0) - t(smoothing)) * res[target] + t(smoothing) * total / t(row.size))


@inlined
def _row_grad(lp, res, target, g, ignore_index, smoothing):
    """Write d loss / d logits of one row, ``g * (softmax - q)`` with q the smoothed
    one-hot target, into ``res`` (zeros when ``target`` is ignored)."""
    t = lp.dtype.type
    if target == ignore_index:
        for c in range(lp.size):
            res[c] = t(0.0)
        return
    uniform = t(smoothing) / t(lp.size)
    for c in range(lp.size):
        res[c] = g * (fexp(lp[c]) - uniform)
    res[target] -= g * (t(1.0) - t(smoothing))


@helper
def _check_targets(target, ignore_index, classes):
    """(rows not ignored, the first row whose target names no class, or -1)."""
    kept = 0
    for r in range(target.size):
        if target[r] != ignore_index:
            if target[r] < 0 or target[r] >= classes:
                return kept, r
            kept += 1
    return kept, -1


@helper
def _loss_row(r, logits, logp, loss, target, ignore_index, smoothing):
    wide_vectors()
    loss[r] = _row_loss(logits[r], logp[r], target[r], ignore_index, smoothing)


@kernel
def cross_entropy_rows(logits, target, ignore_index, smoothing):
    """Per-row loss ``(1-s) * -logp[target] + s * mean(-logp)`` (0 on ignored rows)
    and log_softmax(logits)."""
    rows = logits.shape[0]
    logp = np.empty_like(logits)
    loss = np.empty(rows, dtype=logits.dtype)
    parallel_for(_loss_row, rows, (logits, logp, loss, target, ignore_index, smoothing))
    return loss, logp


@helper
def _grad_row(r, logp, out, target, grad_rows, ignore_index, smoothing):
    _row_grad(logp[r], out[r], target[r], grad_rows[r], ignore_index, smoothing)


@helper
def _grad_row_scaled(r, logp, out, target, g, ignore_index, smoothing):
    _row_grad(logp[r], out[r], target[r], g, ignore_index, smoothing)


@kernel
def cross_entropy_rows_backward(grad_rows, logp, target, ignore_index, smoothing):
    """d logits = grad_row * (softmax - q) with q the smoothed one-hot target."""
    out = np.empty_like(logp)
    parallel_for(_grad_row, logp.shape[0], (logp, out, target, grad_rows, ignore_index, smoothing))
    return out


@kernel
def cross_entropy_total(logits, target, ignore_index, smoothing):
    """(log_softmax(logits), the float64 sum of the per-row losses of
    ``cross_entropy_rows``, the number of rows not ignored, the first row whose target
    names no class or -1); nothing is computed when a target names no class."""
    rows, classes = logits.shape
    logp = np.empty_like(logits)
    loss = np.empty(rows, dtype=logits.dtype)
    kept, bad = _check_targets(target, ignore_index, classes)
    todo = rows if bad < 0 else 0
    parallel_for(_loss_row, todo, (logits, logp, loss, target, ignore_index, smoothing))
    total = 0.0
    for r in range(todo):
        total += loss[r]
    return logp, total, kept, bad


@kernel
def cross_entropy_total_backward(grad, logp, target, ignore_index, smoothing):
    """(d logits of ``grad`` times the sum of the per-row losses, the first row whose
    target names no class or -1); nothing is computed when a target names no class."""
    t = logp.dtype.type
    out = np.empty_like(logp)
    _, bad = _check_targets(target, ignore_index, logp.shape[1])
    g = t(grad)
    todo = logp.shape[0] if bad < 0 else 0
    parallel_for(_grad_row_scaled, todo, (logp, out, target, g, ignore_index, smoothing))
    return out, bad
