"""Shape and movement ops: reshape, permute, expand, concatenate, pad, flip, repeat..."""

from __future__ import annotations

import math
from typing import Any, Sequence

from .. import dtypes
from ..autograd import Function
from ..sizes import check_size
from ..tensor import Tensor
from .shape_utils import normalize_axes, normalize_axis, unbroadcast


class Reshape(Function):
    def forward(self, x, shape):
        self.shape = x.shape
        return self.backend.reshape(x, shape)

    def backward(self, g):
        return self.backend.reshape(g, self.shape), None


class Permute(Function):
    def forward(self, x, axes):
        self.inverse = tuple(sorted(range(len(axes)), key=lambda i: axes[i]))
        return self.backend.transpose(x, axes)

    def backward(self, g):
        return self.backend.transpose(g, self.inverse), None


class Expand(Function):
    def forward(self, x, shape):
        self.shape = x.shape
        return self.backend.broadcast_to(x, shape)

    def backward(self, g):
        return unbroadcast(self.backend, g, self.shape), None


class Concatenate(Function):
    def forward(self, axis, *arrays):
        self.axis, self.sizes = axis, [a.shape[axis] for a in arrays]
        return self.backend.concatenate(arrays, axis)

    def backward(self, g):
        be, grads, start = self.backend, [None], 0
        for size in self.sizes:
            index = (slice(None),) * self.axis + (slice(start, start + size),)
            grads.append(be.getitem(g, index))
            start += size
        return tuple(grads)


class Pad(Function):
    def forward(self, x, widths, value):
        self.index = tuple(slice(lo, lo + n) for (lo, _), n in zip(widths, x.shape))
        return self.backend.pad(x, widths, value)

    def backward(self, g):
        return self.backend.getitem(g, self.index), None, None


class Flip(Function):
    def forward(self, x, axes):
        self.axes = axes
        return self.backend.flip(x, axes)

    def backward(self, g):
        return self.backend.flip(g, self.axes), None


class Copy(Function):
    """A differentiable copy (clone, contiguous, dtype casts, device moves)."""

    def forward(self, x, dtype=None):
        self.dtype = x.dtype
        return self.backend.copy(x) if dtype is None else self.backend.astype(x, dtype)

    def backward(self, g):
        return self.backend.astype(g, self.dtype), None


class ToDevice(Function):
    def forward(self, x, device):
        self.source = self.backend
        self.target = self.backend = backend_for(device)  # the result lives on the target
        return self.target.from_numpy(self.source.to_numpy(x))

    def backward(self, g):
        return self.source.from_numpy(self.target.to_numpy(g)), None


# ----- public functions ----------------------------------------------------------------
def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    shape = tuple(int(n) for n in shape)
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: only one dimension can be -1, got {shape}")
    known = math.prod(n for n in shape if n != -1)
    if -1 in shape:
        if known == 0 or x.numel() % known:
            raise ValueError(f"reshape: cannot reshape {x.shape} into {shape}")
        shape = tuple(x.numel() // known if n == -1 else n for n in shape)
    if math.prod(shape) != x.numel() or any(n < 0 for n in shape):
        raise ValueError(f"reshape: cannot reshape {x.shape} ({x.numel()} elements) into {shape}")
    if shape == x.shape:
        return x
    return Reshape.apply(x, shape)


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if x.ndim == 0:
        return reshape(x, (1,))
    start, end = normalize_axis(start_dim, x.ndim, "flatten"), normalize_axis(end_dim, x.ndim, "flatten")
    if start > end:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    return reshape(x, x.shape[:start] + (math.prod(x.shape[start:end + 1]),) + x.shape[end + 1:])


def permute(x: Tensor, axes: Sequence[int]) -> Tensor:
    axes = tuple(normalize_axis(a, x.ndim, "permute") for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"permute: {axes} is not a permutation of the {x.ndim} axes of {x.shape}")
    return Permute.apply(x, axes)


def transpose(x: Tensor, dim0: int = -2, dim1: int = -1) -> Tensor:
    axes = list(range(x.ndim))
    a, b = normalize_axis(dim0, x.ndim, "transpose"), normalize_axis(dim1, x.ndim, "transpose")
    axes[a], axes[b] = axes[b], axes[a]
    return Permute.apply(x, tuple(axes))


def expand(x: Tensor, shape: Sequence[int]) -> Tensor:
    shape = tuple(shape)
    if len(shape) < x.ndim:
        raise ValueError(f"expand: target {shape} has fewer dims than the input {x.shape}")
    lead = len(shape) - x.ndim
    full = tuple(x.shape[i - lead] if n == -1 and i >= lead else n for i, n in enumerate(shape))
    for i, n in enumerate(x.shape):
        if n != 1 and n != full[lead + i]:
            raise ValueError(f"expand: cannot expand {x.shape} to {shape}")
    check_size("expand", full, x.dtype, x.device)  # a view, but every op reading it allocates its size
    return Expand.apply(x, full) if full != x.shape else x


def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    return expand(x, shape)


def squeeze(x: Tensor, axis: Any = None) -> Tensor:
    if axis is None:
        return reshape(x, tuple(n for n in x.shape if n != 1))
    axes = normalize_axes(axis, x.ndim, "squeeze")
    return reshape(x, tuple(n for i, n in enumerate(x.shape) if not (i in axes and n == 1)))


def unsqueeze(x: Tensor, axis: int) -> Tensor:
    axis = normalize_axis(axis, x.ndim + 1, "unsqueeze")
    return reshape(x, x.shape[:axis] + (1,) + x.shape[axis:])


def concatenate(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("concatenate: needs at least one tensor")
    first = tensors[0]
    axis = normalize_axis(axis, first.ndim, "concatenate")
    for t in tensors[1:]:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis):
            raise ValueError(f"concatenate: shapes {first.shape} and {t.shape} differ outside axis {axis}")
    dtype = _common_dtype(tensors)
    return Concatenate.apply(axis, *[t.to(dtype=dtype) for t in tensors])


cat = concatenate


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: needs at least one tensor")
    for t in tensors[1:]:
        if t.shape != tensors[0].shape:
            raise ValueError(f"stack: all tensors need one shape, got {tensors[0].shape} and {t.shape}")
    axis = normalize_axis(axis, tensors[0].ndim + 1, "stack")
    return concatenate([unsqueeze(t, axis) for t in tensors], axis)


def split(x: Tensor, size: int | Sequence[int], axis: int = 0) -> list[Tensor]:
    """Pieces of ``size`` along axis (the last may be smaller), or of the listed sizes."""
    axis = normalize_axis(axis, x.ndim, "split")
    n = x.shape[axis]
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"split: size must be positive, got {size}")
        sizes = [min(size, n - s) for s in range(0, n, size)] or [0]
    else:
        sizes = list(size)
        if sum(sizes) != n:
            raise ValueError(f"split: sizes {sizes} do not add up to {n} along axis {axis}")
    pieces, start = [], 0
    for s in sizes:
        pieces.append(x[(slice(None),) * axis + (slice(start, start + s),)])
        start += s
    return pieces


def chunk(x: Tensor, chunks: int, axis: int = 0) -> list[Tensor]:
    if chunks <= 0:
        raise ValueError(f"chunk: chunks must be positive, got {chunks}")
    n = x.shape[normalize_axis(axis, x.ndim, "chunk")]
    return split(x, max(1, -(-n // chunks)), axis)


def pad(x: Tensor, pad: Sequence[int], value: float = 0.0) -> Tensor:
    """PyTorch order: ``(left, right)`` for the last axis, then the one before, ..."""
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise ValueError(f"pad: expected pairs for at most {x.ndim} axes, got {tuple(pad)}")
    if any(p < 0 for p in pad):
        raise ValueError(f"pad: negative padding {tuple(pad)} is not supported")
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    check_size("pad", tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, widths)), x.dtype, x.device)
    return Pad.apply(x, tuple(widths), value)


def flip(x: Tensor, axes: int | Sequence[int]) -> Tensor:
    return Flip.apply(x, normalize_axes(axes, x.ndim, "flip"))


def repeat(x: Tensor, repeats: Sequence[int]) -> Tensor:
    """Tile like ``torch.Tensor.repeat``: expand a new axis per repeat, then merge."""
    repeats = tuple(repeats)
    if len(repeats) < x.ndim:
        raise ValueError(f"repeat: need at least {x.ndim} repeat counts for shape {x.shape}, got {repeats}")
    check_size("repeat", tuple(r * n for r, n in zip(repeats, (1,) * (len(repeats) - x.ndim) + x.shape)),
               x.dtype, x.device)
    x = reshape(x, (1,) * (len(repeats) - x.ndim) + x.shape)
    interleaved = tuple(v for pair in zip([1] * x.ndim, x.shape) for v in pair)
    tiled = tuple(v for pair in zip(repeats, x.shape) for v in pair)
    out = expand(reshape(x, interleaved), tiled)
    return reshape(out, tuple(r * n for r, n in zip(repeats, x.shape)))


def clone(x: Tensor) -> Tensor:
    return Copy.apply(x)


def astype(x: Tensor, dtype: Any) -> Tensor:
    out = Copy.apply(x, dtype)
    if out.requires_grad and not dtypes.is_floating(out.dtype):
        out = out.detach()
    return out


def to_device(x: Tensor, device: Any) -> Tensor:
    device = canonical(device)
    backend_for(device)  # raises for an unavailable device
    return ToDevice.apply(x, device)


def _common_dtype(tensors: Sequence[Tensor]) -> Any:
    return dtypes.result_dtype(*tensors)


from ..backends import backend_for  # noqa: E402
from ..devices import canonical  # noqa: E402
