"""Memory formats: the order a 4-D tensor's elements lie in memory, its shape unchanged.

``channels_last`` stores an [N, C, H, W] tensor as N, H, W, C in memory (strides
``(H·W·C, 1, W·C, C)``), as PyTorch's format of that name does.  For a convolution
weight [Cout, C, R, S] that is the [Cout][R][S][C] layout the GPU's implicit-GEMM
kernels read: a model whose weights are stored so (``Module.to(memory_format=
tc.channels_last)``) needs no packed copy of them, on any call or in a compiled plan.
Every op reads tensors through their strides, so the format changes speed and memory,
never results.
"""

from __future__ import annotations

from typing import Any


class MemoryFormat:
    """A named memory format (compare by identity, as ``torch.memory_format``)."""

    def __init__(self, name: str, order: tuple[int, ...]) -> None:
        self.name = name
        self.order = order  # a 4-D tensor's axes from outermost to innermost in memory

    def __repr__(self) -> str:
        return f"tensorcore.{self.name}"


contiguous_format = MemoryFormat("contiguous_format", (0, 1, 2, 3))
channels_last = MemoryFormat("channels_last", (0, 2, 3, 1))
FORMATS = (contiguous_format, channels_last)


def check(memory_format: Any, op: str) -> MemoryFormat:
    """``memory_format`` if it is one of ``FORMATS``, else a TypeError naming ``op``."""
    if not any(memory_format is f for f in FORMATS):
        raise TypeError(f"{op}: memory_format must be tc.contiguous_format or tc.channels_last, "
                        f"got {memory_format!r}")
    return memory_format


def is_laid_out(a: Any, memory_format: MemoryFormat) -> bool:
    """Whether backend array ``a`` lies in memory in ``memory_format`` (a tensor that is
    not 4-D: whether it is C-contiguous)."""
    if a.ndim != 4:
        return bool(a.flags.c_contiguous)
    return bool(a.transpose(memory_format.order).flags.c_contiguous)


def laid_out(t: Any, memory_format: MemoryFormat, device: Any = None, dtype: Any = None) -> Any:
    """Tensor ``t`` with its elements in ``memory_format``, moved to ``device`` and cast
    to ``dtype`` when given (call it under ``no_grad``): ``t`` itself when nothing changes.  A 4-D tensor is
    permuted to the format's order and made dense where it lies, moved, and viewed back,
    so the target device receives one dense copy and never holds a second (other tensors
    are returned contiguous)."""
    from . import ops

    if device is None and dtype is None and is_laid_out(t.data, memory_format):
        return t
    if t.ndim != 4:
        t = t.to(device, dtype=dtype)
        return t if t.data.flags.c_contiguous else ops.clone(t)
    order = memory_format.order
    dense = ops.permute(t, order)
    if not dense.data.flags.c_contiguous:
        dense = ops.clone(dense)
    inverse = tuple(order.index(axis) for axis in range(4))
    return ops.permute(dense.to(device, dtype=dtype), inverse)
