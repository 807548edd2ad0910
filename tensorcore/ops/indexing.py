"""Indexing: ``x[index]`` (gather, scatter-add backward) and ``x[index] = value``."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import autograd, versions
from ..autograd import Function
from ..tensor import Tensor, as_tensor_like
from .shape_utils import nested_shape, unbroadcast


class GetItem(Function):
    def forward(self, x, index):
        self.shape, self.dtype, self.index = x.shape, x.dtype, index
        return self.backend.getitem(x, index)

    def backward(self, g):
        be = self.backend
        grad = be.zeros(self.shape, self.dtype)
        if _is_advanced(self.index):
            be.index_add_(grad, self.index, g)  # repeated indices accumulate
        else:
            be.setitem_(grad, self.index, g)
        return grad, None


class SetItem(Function):
    """out = x with out[index] = value (the functional form of an in-place write)."""

    def forward(self, x, value, index):
        self.index, self.value_shape = index, tuple(getattr(value, "shape", ()))
        out = self.backend.copy(x)
        self.backend.setitem_(out, index, value)
        return out

    def backward(self, g):
        be = self.backend
        grad_x = be.copy(g)
        be.setitem_(grad_x, self.index, be.zeros((), g.dtype))
        grad_value = unbroadcast(be, be.getitem(g, self.index), self.value_shape)
        return grad_x, grad_value, None


def _is_advanced(index: tuple) -> bool:
    return any(hasattr(i, "shape") and i.ndim >= 0 and not isinstance(i, slice) for i in index)


def _convert_index(x: Tensor, index: Any, op: str) -> tuple:
    """Tensors and lists inside an index become backend arrays on x's device."""
    if not isinstance(index, tuple):
        index = (index,)
    out = []
    for i in index:
        if isinstance(i, Tensor):
            if i.device != x.device and i.device != "cpu":
                raise ValueError(f"{op}: index tensor is on {i.device}, indexed tensor on {x.device}")
            if i.device != x.device:
                i = i.to(x.device)  # a CPU index serves any device, as in PyTorch
            if i.dtype.kind not in "iub":
                raise TypeError(f"{op}: index tensors must be integer or bool, got {i.dtype}")
            out.append(i.data)
        elif isinstance(i, list):
            out.append(_list_index(i, op))
        elif i is None or i is Ellipsis or isinstance(i, int | slice):
            out.append(i)
        else:
            raise TypeError(f"{op}: unsupported index element {i!r} of type {type(i).__name__}")
    _check_bounds(x, out, op)
    return tuple(x.backend.array(i) if isinstance(i, np.ndarray) and x.device != "cpu" else i for i in out)


def _list_index(values: list, op: str) -> np.ndarray:
    """A list of ints or bools as a host array (moved to the device after the checks)."""
    nested_shape(values, f"{op}: index list")
    array = np.array(values)
    if array.size == 0:  # [] holds no values to take a dtype from
        array = array.astype(np.int64)
    if array.dtype.kind not in "iub":
        raise TypeError(f"{op}: index lists must hold ints or bools, got {array.dtype} values")
    return array


def _check_bounds(x: Tensor, index: list, op: str) -> None:
    """Raise IndexError for an out-of-range integer or a mask of the wrong shape before
    any kernel runs.  Integer arrays are range-checked where their values are on the
    host (lists, CPU tensors); on the GPU that would cost a round trip."""
    dim = 0
    for pos, i in enumerate(index):
        if i is None:
            continue
        if i is Ellipsis:
            dim = x.ndim - sum(_dims_taken(j) for j in index[pos + 1:] if j is not None and j is not Ellipsis)
            continue
        if dim >= x.ndim:
            raise IndexError(f"{op}: too many indices for a tensor of shape {x.shape}")
        size = x.shape[dim]
        if isinstance(i, int) and not -size <= i < size:
            raise IndexError(f"{op}: index {i} is out of range for axis {dim} of size {size}")
        if hasattr(i, "dtype") and i.dtype == bool:
            covered = x.shape[dim:dim + i.ndim]
            if tuple(i.shape) != covered:
                axes = f"axis {dim}" if i.ndim == 1 else f"axes {dim}..{dim + i.ndim - 1}"
                raise IndexError(f"{op}: a boolean mask of shape {tuple(i.shape)} does not match the size {covered} "
                                 f"of {axes} of the tensor of shape {x.shape}")
        elif isinstance(i, np.ndarray) and i.size and not (-size <= i.min() and i.max() < size):
            bad = i.max() if i.max() >= size else i.min()
            raise IndexError(f"{op}: index {bad} is out of range for axis {dim} of size {size} "
                             f"(index array of shape {i.shape}, tensor shape {x.shape})")
        dim += _dims_taken(i)


def _dims_taken(i: Any) -> int:
    """How many axes of the indexed tensor one index element consumes."""
    return i.ndim if hasattr(i, "dtype") and i.dtype == bool else 1


def getitem(x: Tensor, index: Any) -> Tensor:
    return GetItem.apply(x, _convert_index(x, index, "getitem"))


def setitem(x: Tensor, index: Any, value: Any) -> None:
    """Write ``value`` into ``x[index]``; recorded in the graph when gradients flow."""
    index = _convert_index(x, index, "setitem")
    value = as_tensor_like(value, x, "setitem")
    if value.device != x.device:
        raise ValueError(f"setitem: value is on {value.device}, tensor on {x.device}")
    tracked = autograd.is_grad_enabled() and (x.requires_grad or value.requires_grad)
    if tracked and x.requires_grad and x.is_leaf:
        raise RuntimeError("setitem: a leaf tensor that requires grad cannot be modified in place")
    try:
        if not tracked:
            x.backend.setitem_(x.data, index, x.backend.astype(value.data, x.dtype))
            versions.bump(x.data)
            return
        previous = Tensor._wrap(x.data, x.device)
        previous.requires_grad, previous._ctx = x.requires_grad, x._ctx
        out = SetItem.apply(previous, value.to(dtype=x.dtype), index)
    except ValueError as exc:  # the backend checks the shapes before it writes anything
        target = tuple(x.backend.getitem(x.data, index).shape)
        raise ValueError(f"setitem: a value of shape {value.shape} does not fit the selection of shape {target}") from exc
    versions.continue_from(out.data, x.data)
    x.data, x._ctx, x.requires_grad = out.data, out._ctx, True
