"""Attention over short sequences, one (batch, head) per parallel task.

``softmax(q kᵀ · scale + mask) v`` for q [B, H, Lq, D], k [B, H, Lk, D], v [B, H, Lk, Dv]
of any strides (the heads of a projection are a permuted view of it).  Each task copies
its head's q, k and v into small contiguous arrays (k and v also transposed), so every
inner loop runs along a contiguous row of Lk or D values, which LLVM vectorises; a
dot product along D would add one value at a time (no fast-math, ``jit.py``).  Its
scores and probabilities stay in L1.  A row whose keys are all masked is NaN, as in
``softmax.py``'s row softmax.

The products add over D (or over the keys) one term at a time in index order, in the
inputs' dtype, as a plain matrix product does; the results differ from a BLAS product's
in the last bits only.  ``out`` (and the gradients of q, k and v) are written into
arrays the caller allocates, typically [B, L, H, D] memory seen as [B, H, L, D], so that
merging the heads back (``out.transpose(0, 2, 1, 3).reshape(B, L, H * D)``) copies nothing.
"""

from __future__ import annotations

import numpy as np

from .jit import helper, kernel
from .lanes import lane_axpy
from .mathfn import fexp
from .parallel import parallel_for


@helper
def _contiguous(src, transposed):
    """A C-contiguous copy of the 2-D ``src``, or of its transpose."""
    rows, cols = src.shape
    if transposed:
        out = np.empty((cols, rows), dtype=src.dtype)
        for r in range(rows):
            for c in range(cols):
                out[c, r] = src[r, c]
        return out
    out = np.empty((rows, cols), dtype=src.dtype)
    for r in range(rows):
        for c in range(cols):
            out[r, c] = src[r, c]
    return out


@helper
def _store(src, dst):
    """dst[...] = src for 2-D arrays of one shape (dst of any strides)."""
    for i in range(src.shape[0]):
        for e in range(src.shape[1]):
            dst[i, e] = src[i, e]


@helper
def _times(a, b, out, a_transposed):
    """out = a @ b, or aᵀ @ b when ``a_transposed`` (C-contiguous arrays), each value
    summed over k in order; one vector pass over a row of out per (k, row), the rows
    in the inner loop so that consecutive passes do not wait on each other."""
    out[:] = out.dtype.type(0.0)
    for kk in range(b.shape[0]):
        src = b[kk]
        for i in range(out.shape[0]):
            lane_axpy(out[i], a[kk, i] if a_transposed else a[i, kk], src)


@helper
def _softmax_into(scores, p, i):
    """p[i] = softmax(scores[i]), NaN throughout when the row has no finite normaliser
    (as ``softmax.py``'s rows: all keys masked, or a NaN or +inf score).  The short
    rows are summed in order; ``lane_sum``'s vector loop would double the kernel's
    compile time for nothing."""
    t = p.dtype.type
    m = scores[i, 0]
    for j in range(1, p.shape[1]):
        v = scores[i, j]
        if v > m or v != v:
            m = v
    row = p[i]
    for j in range(p.shape[1]):
        row[j] = fexp(scores[i, j] - m)
    s = t(0.0)
    for j in range(p.shape[1]):
        s += row[j]
    inv = t(1.0) / s if s < t(np.inf) else t(np.nan)
    for j in range(p.shape[1]):
        row[j] *= inv


@helper
def _head(task, q, k, v, mask, causal, scale, heads, out, probs):
    """Head ``task`` (batch task // H, head task % H) of ``attention_heads``."""
    b, h = task // heads, task % heads
    qc, kt, vc = _contiguous(q[b, h], False), _contiguous(k[b, h], True), _contiguous(v[b, h], False)
    p = probs[b, h]
    scores = np.empty(p.shape, dtype=p.dtype)
    _times(qc, kt, scores, False)
    t = p.dtype.type
    for i in range(p.shape[0]):
        for j in range(p.shape[1]):
            scores[i, j] = scores[i, j] * scale + mask[b, h, i, j]
        if causal:
            for j in range(i + 1, p.shape[1]):
                scores[i, j] = t(-np.inf)
        _softmax_into(scores, p, i)
    o = np.empty((p.shape[0], vc.shape[1]), dtype=vc.dtype)
    _times(p, vc, o, False)
    _store(o, out[b, h])


@kernel
def attention_heads(q, k, v, mask, causal, scale, out, probs):
    """out [B, H, Lq, Dv] and probs [B, H, Lq, Lk] (C-contiguous) of attention over
    q, k, v; ``mask`` [B, H, Lq, Lk] is additive (a broadcast view is fine), ``causal``
    hides key j from query i when j > i."""
    t = q.dtype.type
    parallel_for(_head, q.shape[0] * q.shape[1], (q, k, v, mask, causal, t(scale), q.shape[1], out, probs))


@helper
def _head_backward(task, grad, q, k, v, probs, scale, heads, dq, dk, dv):
    """Head ``task`` of ``attention_heads_backward``."""
    b, h = task // heads, task % heads
    t = q.dtype.type
    p = probs[b, h]
    lq, lk = p.shape
    g = _contiguous(grad[b, h], False)
    # dv = pᵀ g
    dv_head = np.empty((lk, g.shape[1]), dtype=g.dtype)
    _times(p, g, dv_head, True)
    _store(dv_head, dv[b, h])
    # d scores = p * (g vᵀ - rowsum(p * g vᵀ)) * scale, as softmax_rows_backward then * scale
    ds = np.empty((lq, lk), dtype=p.dtype)
    _times(g, _contiguous(v[b, h], True), ds, False)
    for i in range(lq):
        dot = t(0.0)
        for j in range(lk):
            dot += ds[i, j] * p[i, j]
        for j in range(lk):
            ds[i, j] = p[i, j] * (ds[i, j] - dot) * scale
    # dq = ds k, dk = dsᵀ q
    dq_head = np.empty((lq, q.shape[3]), dtype=g.dtype)
    _times(ds, _contiguous(k[b, h], False), dq_head, False)
    _store(dq_head, dq[b, h])
    dk_head = np.empty((lk, q.shape[3]), dtype=g.dtype)
    _times(ds, _contiguous(q[b, h], False), dk_head, True)
    _store(dk_head, dk[b, h])


@kernel
def attention_heads_backward(grad, q, k, v, probs, scale, dq, dk, dv):
    """dq, dk, dv (written into the given arrays) of ``attention_heads`` from its
    probabilities and the gradient of its output."""
    t = q.dtype.type
    parallel_for(_head_backward, q.shape[0] * q.shape[1], (grad, q, k, v, probs, t(scale), q.shape[1], dq, dk, dv))
