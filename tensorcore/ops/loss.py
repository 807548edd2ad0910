"""Loss functions: cross-entropy, MSE, L1, binary cross-entropy with logits."""

from __future__ import annotations

from ..autograd import Function
from ..tensor import Tensor
from . import elementwise as ew
from .movement import permute, reshape

REDUCTIONS = ("mean", "sum", "none")


class CrossEntropy(Function):
    """Loss of logits [N, C] against integer targets [N]: per row ("none"), or summed
    or averaged over the rows not ignored in one backend call ("sum", "mean")."""

    def forward(self, logits, target, ignore_index, label_smoothing, reduction):
        self.target, self.ignore_index, self.label_smoothing = target, ignore_index, label_smoothing
        if reduction == "none":
            self.divisor = None
            loss, self.logp = self.backend.cross_entropy(logits, target, ignore_index, label_smoothing)
        else:
            loss, self.logp, self.divisor = self.backend.cross_entropy_reduced(logits, target, ignore_index,
                                                                               label_smoothing, reduction)
        return loss

    def backward(self, g):
        args = (g, self.logp, self.target, self.ignore_index, self.label_smoothing)
        if self.divisor is None:
            grad = self.backend.cross_entropy_backward(*args)
        else:
            grad = self.backend.cross_entropy_reduced_backward(*args, self.divisor)
        return grad, None, None, None, None


def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")


def cross_entropy(logits: Tensor, target: Tensor, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """As ``torch.nn.functional.cross_entropy`` with class-index targets.

    logits [N, C] or [N, C, d1, ...]; target [N] or [N, d1, ...].  'mean' averages
    over the targets that are not ``ignore_index``.
    """
    op = "cross_entropy"
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if logits.ndim < 2 or target.shape != (logits.shape[0],) + logits.shape[2:]:
        raise ValueError(f"{op}: logits {logits.shape} need targets of shape {(logits.shape[0],) + logits.shape[2:]}, got {target.shape}")
    if target.dtype.kind not in "iu":
        raise TypeError(f"{op}: targets must be integer class indices, got {target.dtype}")
    if logits.ndim > 2:  # move classes last and flatten the spatial positions into rows
        logits = permute(logits, (0,) + tuple(range(2, logits.ndim)) + (1,))
    rows = reshape(logits, (-1, logits.shape[-1]))
    loss = CrossEntropy.apply(rows, reshape(target, (-1,)), int(ignore_index), float(label_smoothing), reduction)
    return reshape(loss, target.shape) if reduction == "none" else loss


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:  # noqa: A002
    _check_same_shape("mse_loss", input, target)
    diff = input - target
    return _reduce(diff * diff, reduction, "mse_loss")


def l1_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:  # noqa: A002
    _check_same_shape("l1_loss", input, target)
    return _reduce(ew.abs(input - target), reduction, "l1_loss")


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, reduction: str = "mean",  # noqa: A002
                                     pos_weight: Tensor | None = None) -> Tensor:
    """Stable form: max(x, 0) - x*y + log(1 + exp(-|x|)), with optional pos_weight."""
    _check_same_shape("binary_cross_entropy_with_logits", input, target)
    log_sig_neg = ew.relu(input) + ew.log1p(ew.exp(-ew.abs(input)))  # -log(sigmoid(-x))
    if pos_weight is None:
        loss = log_sig_neg - input * target
    else:
        log_weight = (pos_weight - 1) * target + 1
        loss = (1 - target) * input + log_weight * (log_sig_neg - input)
    return _reduce(loss, reduction, "binary_cross_entropy_with_logits")


def _check_same_shape(op: str, a: Tensor, b: Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{op}: input {a.shape} and target {b.shape} must have the same shape")
