"""Reductions over any axes: sum, mean, var, std, max, min, prod, logsumexp, arg-reductions."""

from __future__ import annotations

import builtins
from typing import Any, NamedTuple

from .. import dtypes
from ..autograd import Function
from ..tensor import Tensor
from .shape_utils import normalize_axes, normalize_axis, torch_spelling


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


class SelectAlongAxis(Function):
    """x's values at ``indices`` (one per row along ``axis``, keepdims shape); the
    gradient goes to those positions only, as PyTorch's ``max(dim=)`` / ``min(dim=)``."""

    def forward(self, x, indices, axis, keepdims):
        be = self.backend
        self.shape, self.indices, self.axis = x.shape, indices, axis
        hits = self._hits()
        values = be.reduce("sum", be.where(hits, x, be.zeros((), x.dtype)), (axis,), True)  # one hit per row: exact
        return values if keepdims else be.reshape(values, _drop(x.shape, (axis,)))

    def backward(self, g):
        be = self.backend
        g = be.reshape(g, self.indices.shape)
        return be.where(self._hits(), g, be.zeros((), g.dtype)), None, None, None

    def _hits(self):
        """A mask of x's shape (by broadcasting) that is true at the selected positions."""
        be = self.backend
        positions = be.arange(0, self.shape[self.axis], 1, self.indices.dtype)
        positions = be.reshape(positions, tuple(-1 if i == self.axis else 1 for i in range(len(self.shape))))
        return be.binary("eq", positions, self.indices)


class ValuesIndices(NamedTuple):
    """What ``max(dim=)`` / ``min(dim=)`` return, as ``torch.return_types.max``."""

    values: Tensor
    indices: Tensor


def _drop(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def _count(x: Tensor, axes: tuple[int, ...]) -> int:
    count = 1
    for a in axes:
        count *= x.shape[a]
    return count


def sum(x: Tensor, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: bool | None = None) -> Tensor:  # noqa: A001
    axis, keepdims = torch_spelling("sum", axis, keepdims, dim, keepdim)
    return Sum.apply(x, normalize_axes(axis, x.ndim, "sum"), keepdims)


def mean(x: Tensor, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: bool | None = None) -> Tensor:
    axis, keepdims = torch_spelling("mean", axis, keepdims, dim, keepdim)
    axes = normalize_axes(axis, x.ndim, "mean")
    return Sum.apply(x, axes, keepdims) / _count(x, axes)  # an empty reduction gives NaN, as PyTorch


def var(x: Tensor, axis: Any = None, keepdims: bool = False, correction: int = 1, *, dim: Any = None,
        keepdim: bool | None = None) -> Tensor:
    """Variance with Bessel's ``correction`` (1 = unbiased, as torch.var)."""
    axis, keepdims = torch_spelling("var", axis, keepdims, dim, keepdim)
    axes = normalize_axes(axis, x.ndim, "var")
    centered = x - mean(x, axes, keepdims=True)
    return sum(centered * centered, axes, keepdims) / builtins.max(_count(x, axes) - correction, 0)


def std(x: Tensor, axis: Any = None, keepdims: bool = False, correction: int = 1, *, dim: Any = None,
        keepdim: bool | None = None) -> Tensor:
    axis, keepdims = torch_spelling("std", axis, keepdims, dim, keepdim)
    return var(x, axis, keepdims, correction).sqrt()


def max(x: Tensor, axis: Any = None, keepdims: bool = False, *, dim: int | None = None,  # noqa: A001
        keepdim: bool | None = None) -> Tensor | ValuesIndices:
    """The largest values over ``axis`` (NumPy: returns the values), or with ``dim=``
    (PyTorch: one axis) ``(values, indices)``."""
    return _extremum("max", x, axis, keepdims, dim, keepdim)


def min(x: Tensor, axis: Any = None, keepdims: bool = False, *, dim: int | None = None,  # noqa: A001
        keepdim: bool | None = None) -> Tensor | ValuesIndices:
    """The smallest values over ``axis``, or with ``dim=`` ``(values, indices)``; see ``max``."""
    return _extremum("min", x, axis, keepdims, dim, keepdim)


def _extremum(op: str, x: Tensor, axis: Any, keepdims: bool, dim: int | None, keepdim: bool | None) -> Any:
    torch_style = dim is not None
    axis, keepdims = torch_spelling(op, axis, keepdims, dim, keepdim)
    if not torch_style:
        return Extremum.apply(x, op, normalize_axes(axis, x.ndim, op), keepdims)
    axis = normalize_axis(axis, x.ndim, op)
    if x.ndim == 0:
        return ValuesIndices(x.clone(), Tensor._wrap(x.backend.zeros((), dtypes.int64), x.device))
    if x.shape[axis] == 0:
        raise ValueError(f"{op}: cannot reduce axis {axis} of size 0 of a tensor of shape {x.shape}")
    indices = x.backend.arg_reduce(f"arg{op}", x.data, axis, True)
    values = SelectAlongAxis.apply(x, indices, axis, keepdims)
    if not keepdims:
        indices = x.backend.reshape(indices, _drop(x.shape, (axis,)))
    return ValuesIndices(values, Tensor._wrap(indices, x.device))


def prod(x: Tensor, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: bool | None = None) -> Tensor:
    axis, keepdims = torch_spelling("prod", axis, keepdims, dim, keepdim)
    return Prod.apply(x, normalize_axes(axis, x.ndim, "prod"), keepdims)


def logsumexp(x: Tensor, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
              keepdim: bool | None = None) -> Tensor:
    axis, keepdims = torch_spelling("logsumexp", axis, keepdims, dim, keepdim)
    return LogSumExp.apply(x, normalize_axes(axis, x.ndim, "logsumexp"), keepdims)


def _arg_reduce(op: str, x: Tensor, axis: int | None, keepdims: bool) -> Tensor:
    if x.data.size == 0:
        raise ValueError(f"{op}: cannot reduce an empty tensor of shape {x.shape}")
    if axis is not None:
        axis = normalize_axis(axis, x.ndim, op)
    return Tensor._wrap(x.backend.arg_reduce(op, x.data, axis, keepdims), x.device)


def argmax(x: Tensor, axis: int | None = None, keepdims: bool = False, *, dim: int | None = None,
           keepdim: bool | None = None) -> Tensor:
    return _arg_reduce("argmax", x, *torch_spelling("argmax", axis, keepdims, dim, keepdim))


def argmin(x: Tensor, axis: int | None = None, keepdims: bool = False, *, dim: int | None = None,
           keepdim: bool | None = None) -> Tensor:
    return _arg_reduce("argmin", x, *torch_spelling("argmin", axis, keepdims, dim, keepdim))
