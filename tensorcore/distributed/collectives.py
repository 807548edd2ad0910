"""Collectives on tensors, as ``torch.distributed`` names them.

``all_reduce`` and ``broadcast`` work in place, ``all_gather`` and ``reduce_scatter``
write into the output they are given; every rank must call the same collectives in
the same order with tensors of the same shapes and dtype.  Each is one backend call
(``collective_``), so it runs on the current stream on the GPU and a compiled plan
records it like a kernel.  They are not differentiable.
"""

from __future__ import annotations

from typing import Any, Sequence

from .. import dtypes, versions
from ..tensor import Tensor
from . import group

REDUCE_OPS = ("sum", "avg", "max")


def all_reduce(tensor: Tensor, op: str = "sum") -> None:
    """Combine ``tensor`` over all ranks in place: every rank ends with the sum, the
    average or the maximum."""
    communicator = _ready("all_reduce", [tensor])
    _check_reduction("all_reduce", op, tensor)
    _collective(communicator, "all_reduce", tensor, tensor, reduce=op)


def broadcast(tensor: Tensor, src: int = 0) -> None:
    """Overwrite ``tensor`` on every rank with rank ``src``'s values."""
    communicator = _ready("broadcast", [tensor])
    if not isinstance(src, int) or not 0 <= src < communicator.world_size:
        raise ValueError(f"broadcast: src must be a rank in 0..{communicator.world_size - 1}, got {src!r}")
    _collective(communicator, "broadcast", tensor, tensor, root=src)


def all_gather(output: Tensor | Sequence[Tensor], input: Tensor) -> None:  # noqa: A002  (torch's name)
    """Every rank's ``input``, rank by rank, into ``output``: a tensor holding world size
    inputs stacked or concatenated along its first dimension, or a list of world size
    tensors shaped like ``input``."""
    communicator = _ready("all_gather", [input])
    if isinstance(output, Tensor):
        _ready("all_gather", [output])
        _check_parts("all_gather", output, input, communicator.world_size, "output")
        _collective(communicator, "all_gather", output, input)
        return
    outputs = _check_list("all_gather", output, input, communicator.world_size, "output")
    backend = input.backend
    gathered = backend.empty((len(outputs), input.numel()), input.dtype)
    _collective(communicator, "all_gather", Tensor._wrap(gathered, input.device), input)
    for t, row in zip(outputs, gathered):
        backend.copy_(t.data, backend.reshape(row, t.shape))
        versions.bump(t.data)


def reduce_scatter(output: Tensor, input: Tensor | Sequence[Tensor], op: str = "sum") -> None:  # noqa: A002
    """Combine ``input`` over all ranks and keep this rank's part in ``output``: ``input``
    holds world size parts shaped like ``output`` (stacked or concatenated along its first
    dimension, or a list); rank r keeps part r of the sum, average or maximum."""
    communicator = _ready("reduce_scatter", [output])
    _check_reduction("reduce_scatter", op, output)
    if isinstance(input, Tensor):
        _ready("reduce_scatter", [input])
        _check_parts("reduce_scatter", input, output, communicator.world_size, "input")
    else:
        inputs = _check_list("reduce_scatter", input, output, communicator.world_size, "input")
        backend = output.backend
        input = Tensor._wrap(backend.concatenate([backend.reshape(t.data, (-1,)) for t in inputs], 0), output.device)
    _collective(communicator, "reduce_scatter", output, input, reduce=op)


def barrier() -> None:
    """Return once every rank has called ``barrier``."""
    group.communicator("barrier").run("barrier", None, None)


# ----- checks and the call ---------------------------------------------------------------
def _ready(op: str, tensors: list[Tensor]) -> Any:
    """The communicator, once the tensors suit it: on its device, contiguous."""
    communicator = group.communicator(op)
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: expected a Tensor, got {type(t).__name__}")
        if t.device != communicator.device:
            raise ValueError(f"{op}: the tensor is on {t.device}, the {communicator.backend} backend works on "
                             f"{communicator.device} tensors")
        if not t.data.flags.c_contiguous:
            raise ValueError(f"{op}: the tensor of shape {t.shape} is not contiguous; pass t.contiguous()")
    return communicator


def _check_reduction(op: str, reduce: str, t: Tensor) -> None:
    if reduce not in REDUCE_OPS:
        raise ValueError(f"{op}: op must be one of {REDUCE_OPS}, got {reduce!r}")
    if t.dtype == dtypes.bool_:
        raise TypeError(f"{op}: cannot reduce a bool tensor; convert it to an integer dtype")
    if reduce == "avg" and not dtypes.is_floating(t.dtype):
        raise TypeError(f"{op}: op 'avg' needs a floating-point tensor, got {t.dtype}")


def _check_parts(op: str, whole: Tensor, part: Tensor, world: int, name: str) -> None:
    """``whole`` holds ``world`` tensors shaped like ``part``, stacked or concatenated."""
    stacked = (world, *part.shape)
    joined = (world * part.shape[0], *part.shape[1:]) if part.ndim else stacked
    if whole.shape not in (stacked, joined) or whole.dtype != part.dtype:
        raise ValueError(f"{op}: {name} must be {part.dtype} {stacked} or {joined} for {world} ranks of "
                         f"{part.dtype} {part.shape}, got {whole.dtype} {whole.shape}")


def _check_list(op: str, tensors: Sequence[Tensor], like: Tensor, world: int, name: str) -> list[Tensor]:
    tensors = list(tensors)
    if len(tensors) != world:
        raise ValueError(f"{op}: {name} must hold one tensor per rank ({world}), got {len(tensors)}")
    for t in tensors:
        if not isinstance(t, Tensor) or t.shape != like.shape or t.dtype != like.dtype or t.device != like.device:
            raise ValueError(f"{op}: each {name} tensor must be {like.dtype} {like.shape} on {like.device}")
    return tensors


def _collective(communicator: Any, op: str, dst: Tensor, src: Tensor, reduce: str = "sum", root: int = 0) -> None:
    dst.backend.collective_(dst.data, src.data, communicator, op, reduce=reduce, root=root)
    versions.bump(dst.data)
