"""Reductions over any axes: sum, mean, var, std, max, min, prod, logsumexp, arg-reductions."""

from __future__ import annotations

import builtins
from typing import Any

from ..autograd import Function
from ..tensor import Tensor
from .shape_utils import normalize_axes, normalize_axis


def _kept_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else n for i, n in enumerate(shape))


class Sum(Function):
    def forward(self, x, axes, keepdims):
        self.shape, self.axes = x.shape, axes
        return self.backend.reduce("sum", x, axes, keepdims)

    def backward(self, g):
        be = self.backend
        g = be.reshape(g, _kept_shape(self.shape, self.axes))
        return be.broadcast_to(g, self.shape), None, None


class Extremum(Function):
    """max / min; the gradient is shared evenly among tied extreme elements (as PyTorch)."""

    def forward(self, x, op, axes, keepdims):
        if x.size == 0:
            raise ValueError(f"{op}: cannot reduce an empty tensor of shape {x.shape}")
        self.x, self.axes = x, axes
        self.y = self.backend.reduce(op, x, axes, True)
        return self.y if keepdims else self.backend.reshape(self.y, _drop(x.shape, axes))

    def backward(self, g):
        be = self.backend
        hits = be.astype(be.binary("eq", self.x, self.y), g.dtype)
        count = be.reduce("sum", hits, self.axes, True)
        g = be.reshape(g, self.y.shape)
        return be.binary("mul", hits, be.binary("div", g, count)), None, None, None


class Prod(Function):
    def forward(self, x, axes, keepdims):
        self.x, self.axes = x, axes
        self.y = self.backend.reduce("prod", x, axes, True)
        return self.y if keepdims else self.backend.reshape(self.y, _drop(x.shape, axes))

    def backward(self, g):
        be = self.backend
        g = be.reshape(g, self.y.shape)
        # d prod / d x_i = prod of the others; computed by division where x_i != 0 and
        # by an explicit product of the others where it is 0
        nonzero = be.binary("ne", self.x, 0)
        safe = be.where(nonzero, self.x, 1)
        others = be.binary("div", be.reduce("prod", safe, self.axes, True), safe)
        zeros = be.reduce("sum", be.astype(be.unary("logical_not", nonzero), self.x.dtype), self.axes, True)
        others = be.where(nonzero, be.binary("mul", others, be.astype(be.binary("eq", zeros, 0), self.x.dtype)),
                          be.binary("mul", others, be.astype(be.binary("eq", zeros, 1), self.x.dtype)))
        return be.binary("mul", g, others), None, None


class LogSumExp(Function):
    def forward(self, x, axes, keepdims):
        be = self.backend
        if x.size == 0:
            raise ValueError(f"logsumexp: cannot reduce an empty tensor of shape {x.shape}")
        peak = be.reduce("max", x, axes, True)
        peak = be.where(be.unary("isinf", peak), be.zeros((), x.dtype), peak)
        self.x = x
        self.y = be.binary("add", be.unary("log", be.reduce("sum", be.unary("exp", be.binary("sub", x, peak)), axes, True)), peak)
        self.axes = axes
        return self.y if keepdims else be.reshape(self.y, _drop(x.shape, axes))

    def backward(self, g):
        be = self.backend
        g = be.reshape(g, self.y.shape)
        return be.binary("mul", g, be.unary("exp", be.binary("sub", self.x, self.y))), None, None


def _drop(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def sum(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return Sum.apply(x, normalize_axes(axis, x.ndim, "sum"), keepdims)


def mean(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    axes = normalize_axes(axis, x.ndim, "mean")
    count = 1
    for a in axes:
        count *= x.shape[a]
    return Sum.apply(x, axes, keepdims) / count  # an empty reduction gives NaN, as PyTorch


def var(x: Tensor, axis: Any = None, keepdims: bool = False, correction: int = 1) -> Tensor:
    """Variance with Bessel's ``correction`` (1 = unbiased, as torch.var)."""
    axes = normalize_axes(axis, x.ndim, "var")
    count = 1
    for a in axes:
        count *= x.shape[a]
    centered = x - mean(x, axes, keepdims=True)
    return sum(centered * centered, axes, keepdims) / builtins.max(count - correction, 0)


def std(x: Tensor, axis: Any = None, keepdims: bool = False, correction: int = 1) -> Tensor:
    return var(x, axis, keepdims, correction).sqrt()


def max(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return Extremum.apply(x, "max", normalize_axes(axis, x.ndim, "max"), keepdims)


def min(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return Extremum.apply(x, "min", normalize_axes(axis, x.ndim, "min"), keepdims)


def prod(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    return Prod.apply(x, normalize_axes(axis, x.ndim, "prod"), keepdims)


def logsumexp(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    return LogSumExp.apply(x, normalize_axes(axis, x.ndim, "logsumexp"), keepdims)


def _arg_reduce(op: str, x: Tensor, axis: int | None, keepdims: bool) -> Tensor:
    if x.data.size == 0:
        raise ValueError(f"{op}: cannot reduce an empty tensor of shape {x.shape}")
    if axis is not None:
        axis = normalize_axis(axis, x.ndim, op)
    return Tensor._wrap(x.backend.arg_reduce(op, x.data, axis, keepdims), x.device)


def argmax(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    return _arg_reduce("argmax", x, axis, keepdims)


def argmin(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    return _arg_reduce("argmin", x, axis, keepdims)
