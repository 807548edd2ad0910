"""Normalisation layers' functional forms: layer, group and batch norm."""

from __future__ import annotations

import math
from typing import Any, Sequence

from .. import versions
from ..autograd import Function
from ..backends.base import ACTIVATIONS
from ..tensor import Tensor



class LayerNorm(Function):
    def forward(self, x, w, b, n_norm, eps):
        self.x, self.w, self.has_bias, self.n_norm = x, w, b is not None, n_norm
        y, self.mean, self.rstd = self.backend.layer_norm(x, w, b, n_norm, eps)
        return y

    def backward(self, g):
        gx, gw, gb = self.backend.layer_norm_backward(g, self.x, self.w, self.mean, self.rstd, self.n_norm)
        return gx, gw, gb if self.has_bias else None, None, None


class GroupNorm(Function):
    def forward(self, x, w, b, groups, eps, act):
        self.x, self.w, self.b, self.groups, self.act = x, w, b, groups, act
        y, self.mean, self.rstd = self.backend.group_norm(x, w, b, groups, eps, act)
        return y

    def backward(self, g):
        gx, gw, gb = self.backend.group_norm_backward(g, self.x, self.w, self.b, self.mean, self.rstd,
                                                      self.groups, self.act)
        return gx, gw, gb if self.b is not None else None, None, None, None


class BatchNorm(Function):
    def forward(self, x, w, b, running_mean, running_var, training, momentum, eps):
        self.x, self.w, self.has_bias, self.training = x, w, b is not None, training
        y, self.mean, self.rstd = self.backend.batch_norm(x, w, b, running_mean, running_var, training, momentum, eps)
        return y

    def backward(self, g):
        gx, gw, gb = self.backend.batch_norm_backward(g, self.x, self.w, self.mean, self.rstd, self.training)
        return gx, gw, gb if self.has_bias else None, None, None, None, None, None


def _check_affine(op: str, name: str, t: Tensor | None, shape: tuple[int, ...]) -> None:
    if t is not None and t.shape != shape:
        raise ValueError(f"{op}: {name} must have shape {shape}, got {t.shape}")


def layer_norm(x: Tensor, normalized_shape: int | Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if x.shape[x.ndim - len(shape):] != shape or len(shape) > x.ndim:
        raise ValueError(f"layer_norm: input {x.shape} does not end with normalized_shape {shape}")
    _check_affine("layer_norm", "weight", weight, shape)
    _check_affine("layer_norm", "bias", bias, shape)
    return LayerNorm.apply(x, weight, bias, len(shape), float(eps))


def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5, act: str = "none") -> Tensor:
    """GroupNorm over [N, C, *]; ``act`` fuses an activation (e.g. 'silu') after it."""
    if x.ndim < 2 or num_groups < 1 or x.shape[1] % num_groups:
        raise ValueError(f"group_norm: {num_groups} groups must divide the channels of input {x.shape}")
    if act not in ACTIVATIONS:
        raise ValueError(f"group_norm: act must be one of {ACTIVATIONS}, got {act!r}")
    _check_affine("group_norm", "weight", weight, (x.shape[1],))
    _check_affine("group_norm", "bias", bias, (x.shape[1],))
    return GroupNorm.apply(x, weight, bias, num_groups, float(eps), act)


def batch_norm(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """BatchNorm over [N, C, *]; training mode updates the running stats in place."""
    if x.ndim < 2:
        raise ValueError(f"batch_norm: expected [N, C, *], got {x.shape}")
    c = x.shape[1]
    for name, t in (("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)):
        _check_affine("batch_norm", name, t, (c,))
    if not training and (running_mean is None or running_var is None):
        raise ValueError("batch_norm: eval mode needs running_mean and running_var")
    if training and math.prod(x.shape) // c <= 1:
        raise ValueError(f"batch_norm: training needs more than one value per channel, got input {x.shape}")
    stats: list[Any] = [None if t is None else t.data for t in (running_mean, running_var)]
    y = BatchNorm.apply(x, weight, bias, stats[0], stats[1], training, float(momentum), float(eps))
    if training:  # the running statistics were updated in place
        versions.bump(*(s for s in stats if s is not None))
    return y
