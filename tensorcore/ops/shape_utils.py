"""Shape helpers shared by the ops: axis normalisation and broadcast reduction."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np


def broadcast_shapes(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape that ``shapes`` broadcast to, or a ValueError naming ``op`` and the shapes."""
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(f"{op}: shapes {' and '.join(map(str, shapes))} do not broadcast together") from None


def nested_shape(data: Any, what: str) -> tuple[int, ...]:
    """The shape of nested lists/tuples of scalars, or a ValueError naming ``what`` and
    where the lengths disagree (NumPy only says "inhomogeneous")."""
    shape: list[int] = []
    level = [data]
    while level and all(isinstance(item, list | tuple) for item in level):
        lengths = {len(item) for item in level}
        if len(lengths) > 1:
            raise ValueError(f"{what} is ragged: at depth {len(shape)} the sequences have lengths "
                             f"{sorted(lengths)}; every sequence at one depth must have the same length")
        shape.append(lengths.pop())
        level = [element for item in level for element in item]
    if any(isinstance(item, list | tuple) for item in level):
        raise ValueError(f"{what} is ragged: at depth {len(shape)} sequences are mixed with scalars")
    return tuple(shape)


def unbroadcast(backend: Any, grad: Any, shape: tuple[int, ...]) -> Any:
    """Sum a broadcast gradient back down to the input's ``shape``."""
    if tuple(grad.shape) == tuple(shape):
        return grad
    extra = grad.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(extra + i for i, n in enumerate(shape) if n == 1 and grad.shape[extra + i] != 1)
    if axes:
        grad = backend.reduce("sum", grad, axes, True)
    return backend.reshape(grad, tuple(shape))


def torch_spelling(op: str, axis: Any, keepdims: bool, dim: Any, keepdim: bool | None) -> tuple[Any, bool]:
    """PyTorch's ``dim=`` / ``keepdim=`` as aliases of ``axis=`` / ``keepdims=``; both
    spellings of one argument raise a TypeError."""
    if dim is not None:
        if axis is not None:
            raise TypeError(f"{op}: got both axis={axis!r} and dim={dim!r}; pass one (dim is PyTorch's name for axis)")
        axis = dim
    if keepdim is not None:
        if keepdims:
            raise TypeError(f"{op}: got both keepdims= and keepdim=; pass one (keepdim is PyTorch's name)")
        keepdims = keepdim
    return axis, keepdims


def normalize_axis(axis: int, ndim: int, op: str) -> int:
    """A valid non-negative axis for a tensor of ``ndim`` dims, or a ValueError."""
    if not isinstance(axis, int):
        raise TypeError(f"{op}: axis must be an int, got {type(axis).__name__}")
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ValueError(f"{op}: axis {axis} is out of range for a tensor with {ndim} dims")
    return axis % max(ndim, 1)


def normalize_axes(axes: int | Iterable[int] | None, ndim: int, op: str) -> tuple[int, ...]:
    """All axes (None) or the given ones, non-negative, unique and sorted."""
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, int):
        axes = (axes,)
    elif not isinstance(axes, Iterable):
        raise TypeError(f"{op}: axis must be an int or a sequence of ints, got {type(axes).__name__}")
    out = tuple(sorted(normalize_axis(a, ndim, op) for a in axes))
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: repeated axis in {tuple(axes)}")
    return out
