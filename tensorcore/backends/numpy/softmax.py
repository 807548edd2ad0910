"""Softmax family over the last axis, cross-entropy, and scaled dot-product attention.

All reductions subtract the row maximum first, so large logits never overflow.
"""

from __future__ import annotations

import math
from typing import Any

import numpy

Array = Any
REDUCTIONS = ("mean", "sum")  # the reductions of cross_entropy_reduced


def check_reduction(op: str, reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")


class NumpySoftmaxKernels:
    """softmax, log_softmax, cross_entropy and attention for any NumPy-like ``xp``."""

    xp: Any

    def softmax(self, x: Array) -> Array:
        """A row holding +inf or NaN, or only -inf, is NaN throughout (as in PyTorch, quietly)."""
        xp = self.xp
        with numpy.errstate(invalid="ignore"):  # inf - inf
            e = xp.exp(x - x.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)

    def softmax_backward(self, grad: Array, y: Array) -> Array:
        """y is the softmax output: dx = y * (grad - sum(grad * y))."""
        return y * (grad - (grad * y).sum(axis=-1, keepdims=True))

    def log_softmax(self, x: Array) -> Array:
        """NaN on the rows where ``softmax`` is NaN."""
        xp = self.xp
        with numpy.errstate(invalid="ignore"):  # inf - inf
            shifted = x - x.max(axis=-1, keepdims=True)
            return shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))

    def log_softmax_backward(self, grad: Array, y: Array) -> Array:
        """y is the log_softmax output: dx = grad - exp(y) * sum(grad)."""
        return grad - self.xp.exp(y) * grad.sum(axis=-1, keepdims=True)

    def _check_targets(self, op: str, logits_shape: tuple, target: Array) -> None:
        if len(logits_shape) != 2 or target.shape != logits_shape[:1]:
            raise ValueError(f"{op}: expected logits [N, C] and target [N], got "
                             f"{tuple(logits_shape)} and {tuple(target.shape)}")
        if target.dtype.kind not in "iu":
            raise TypeError(f"{op}: target must hold integer class indices, got "
                            f"{target.dtype}")
        if logits_shape[1] < 1:
            raise ValueError(f"{op}: logits need at least one class")

    def _target_rows(self, op: str, target: Array, ignore_index: int,
                     classes: int) -> tuple[Array, Array, Array]:
        """(keep [N] bool, row indices, target classes with ignored rows pointed at
        class 0) for picking each row's target entry with one fancy index."""
        xp = self.xp
        keep = self._check_target_range(op, classes, target, ignore_index)
        return keep, xp.arange(target.shape[0]), xp.where(keep, target, 0)

    @staticmethod
    def _check_target_range(op: str, classes: int, target: Array, ignore_index: int) -> Array:
        """The rows that are not ignored; raises when one of them names no class."""
        keep = target != ignore_index
        bad = keep & ((target < 0) | (target >= classes))
        if bad.any():
            raise ValueError(f"{op}: target {int(target[bad][0])} is outside the {classes} "
                             f"classes (ignore_index={ignore_index})")
        return keep

    def cross_entropy(self, logits: Array, target: Array, ignore_index: int,
                      label_smoothing: float) -> tuple[Array, Array]:
        """Per-row loss [N] as torch.nn.functional.cross_entropy(reduction='none'):
        (1 - eps) * -logp[target] + eps / C * -sum(logp), 0 on ignored rows.
        Also returns log_softmax(logits) for the backward."""
        xp = self.xp
        self._check_targets("cross_entropy", logits.shape, target)
        classes = logits.shape[1]
        logp = self.log_softmax(logits)
        keep, rows, safe = self._target_rows("cross_entropy", target, ignore_index, classes)
        loss = xp.where(keep, logp[rows, safe], 0) * -(1.0 - label_smoothing)
        if label_smoothing:
            smooth = -logp.sum(axis=1)
            loss = loss + (label_smoothing / classes) * xp.where(keep, smooth, 0)
        return loss.astype(logp.dtype, copy=False), logp

    def cross_entropy_backward(self, grad_rows: Array, logp: Array, target: Array,
                               ignore_index: int, label_smoothing: float) -> Array:
        """d logits = grad_rows * (softmax - (1 - eps) * one_hot - eps / C), 0 on
        ignored rows."""
        xp = self.xp
        self._check_targets("cross_entropy_backward", logp.shape, target)
        classes = logp.shape[1]
        keep, rows, safe = self._target_rows("cross_entropy_backward", target, ignore_index,
                                             classes)
        d = xp.exp(logp)
        d[rows, safe] -= 1.0 - label_smoothing
        if label_smoothing:
            d -= label_smoothing / classes
        d *= xp.where(keep, grad_rows, 0)[:, None]
        return d.astype(logp.dtype, copy=False)

    def cross_entropy_reduced(self, logits: Array, target: Array, ignore_index: int,
                              label_smoothing: float, reduction: str) -> tuple[Array, Array, Array]:
        """The per-row losses of ``cross_entropy`` summed ("sum") or averaged over the
        rows not ignored ("mean"; NaN when every row is), summed in float64: (loss 0-d,
        log_softmax [N, C], the divisor as a float64 0-d array for the backward)."""
        xp = self.xp
        check_reduction("cross_entropy_reduced", reduction)
        loss, logp = self.cross_entropy(logits, target, ignore_index, label_smoothing)
        if reduction == "mean":
            divisor = xp.asarray((target != ignore_index).sum(), dtype=xp.float64)
        else:
            divisor = xp.ones((), dtype=xp.float64)
        with numpy.errstate(invalid="ignore"):  # 0 / 0: every row ignored
            total = loss.sum(dtype=xp.float64) / divisor
        return xp.asarray(total, dtype=loss.dtype), logp, divisor

    def cross_entropy_reduced_backward(self, grad: Array, logp: Array, target: Array,
                                       ignore_index: int, label_smoothing: float,
                                       divisor: Array) -> Array:
        """d logits [N, C] of ``cross_entropy_reduced``'s loss, given its gradient
        ``grad`` (0-d) and the forward's divisor: each row's loss has gradient
        grad / divisor."""
        xp = self.xp
        if grad.ndim != 0:
            raise ValueError(f"cross_entropy_reduced_backward: grad must be 0-d (the "
                             f"gradient of the reduced loss), got shape {tuple(grad.shape)}")
        with numpy.errstate(divide="ignore", invalid="ignore"):  # no row kept: every row gets 0
            row = xp.asarray(grad / divisor, dtype=logp.dtype)
        return self.cross_entropy_backward(xp.broadcast_to(row, logp.shape[:1]), logp, target,
                                           ignore_index, label_smoothing)

    def attention(self, q: Array, k: Array, v: Array, mask: Array | None,
                  causal: bool, scale: float) -> tuple[Array, Array]:
        """softmax(q kᵀ * scale + mask) v over [B, H, L, D]; returns (out, probs).

        ``causal`` masks key j for query i when j > i (PyTorch's ``is_causal``: the
        lower triangle of a [Lq, Lk] matrix of ones is kept)."""
        xp = self.xp
        fits = (q.ndim == k.ndim == v.ndim == 4 and q.shape[:2] == k.shape[:2] == v.shape[:2]
                and q.shape[3] == k.shape[3] and k.shape[2] == v.shape[2])
        if not fits:
            raise ValueError(f"attention: expected q [B, H, Lq, D], k [B, H, Lk, D], "
                             f"v [B, H, Lk, Dv], got {q.shape}, {k.shape}, {v.shape}")
        scores = self._attention_scores(q, k, causal, scale)
        if mask is not None:
            scores = scores + mask.astype(scores.dtype, copy=False)
        probs = self.softmax(scores)
        return xp.matmul(probs, v), probs

    def _attention_scores(self, q: Array, k: Array, causal: bool, scale: float) -> Array:
        """q kᵀ · scale, -inf where ``causal`` hides key j from query i (j > i)."""
        xp = self.xp
        scores = xp.matmul(q, k.swapaxes(-1, -2)) * scale
        if causal:
            lq, lk = scores.shape[-2:]
            above = xp.arange(lk)[None, :] > xp.arange(lq)[:, None]
            scores = xp.where(above, -xp.inf, scores)
        return scores

    def attention_output(self, q: Array, k: Array, v: Array, mask: Array | None,
                         causal: bool, scale: float) -> Array:
        """``attention``'s output (the probabilities are made and dropped)."""
        return self.attention(q, k, v, mask, causal, scale)[0]

    def attention_backward(self, grad: Array, q: Array, k: Array, v: Array,
                           probs: Array, scale: float) -> tuple[Array, Array, Array]:
        """(dq, dk, dv) of ``attention`` given its saved probabilities."""
        xp = self.xp
        dv = xp.matmul(probs.swapaxes(-1, -2), grad)
        dscores = self.softmax_backward(xp.matmul(grad, v.swapaxes(-1, -2)), probs) * scale
        dq = xp.matmul(dscores, k)
        dk = xp.matmul(dscores.swapaxes(-1, -2), q)
        return dq, dk, dv

    def attention_lse(self, q: Array, k: Array, v: Array, mask: Array | None,
                      causal: bool, scale: float) -> tuple[Array, Array] | None:
        """None: on the CPU keeping the probabilities costs less than recomputing them
        in the backward, so ``attention`` serves training calls here."""
        return None

    def attention_lse_backward(self, grad: Array, q: Array, k: Array, v: Array, out: Array,
                               lse: Array, causal: bool, scale: float) -> tuple[Array, Array, Array]:
        """(dq, dk, dv) from the output and the rows' base-2 log-sum-exp, the
        probabilities recomputed: P = 2^(S · log2 e - lse), dS = P (dP - rowsum(grad · out))."""
        xp = self.xp
        scores = self._attention_scores(q, k, causal, scale)
        probs = xp.exp2(scores * math.log2(math.e) - lse[..., None].astype(scores.dtype))
        dv = xp.matmul(probs.swapaxes(-1, -2), grad)
        delta = (grad * out).sum(-1, keepdims=True)
        dscores = probs * (xp.matmul(grad, v.swapaxes(-1, -2)) - delta) * scale
        return xp.matmul(dscores, k), xp.matmul(dscores.swapaxes(-1, -2), q), dv
