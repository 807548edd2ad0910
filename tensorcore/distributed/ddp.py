"""``DistributedDataParallel``: the same model on every rank, trained on different data.

Wrapping broadcasts rank 0's parameters and buffers, so every rank starts from the
same weights; after that, every backward pass averages the gradients over the ranks
(``buckets.py``: in buckets, overlapped with the rest of backward), so every rank's
optimizer takes the same step.  The averaging hangs on the parameters themselves:
backward through the wrapped module, called through the wrapper or not, is averaged,
and so is a backward recorded by ``tc.compile`` (the collectives are backend calls:
on the GPU they are captured in the step's CUDA graph).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from layers import Module

from .. import autograd
from . import collectives, group
from .buckets import GradReducer


class DistributedDataParallel(Module):
    """``module`` data-parallel over the ranks of ``tensorcore.distributed.init()``.

    ``bucket_mb``: the size of the gradient buckets, in MiB, each one all-reduce.
    Buffers (running statistics) are broadcast from rank 0 here only."""

    def __init__(self, module: Module, bucket_mb: float = 25) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: expected a Module, got {type(module).__name__}")
        if not bucket_mb > 0:
            raise ValueError(f"DistributedDataParallel: bucket_mb must be > 0, got {bucket_mb!r}")
        communicator = group.communicator("DistributedDataParallel")
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError(f"DistributedDataParallel: {type(module).__name__} has no parameter that requires grad")
        devices = {t.device for t in (*module.parameters(), *module.buffers())}
        if devices != {communicator.device}:
            raise ValueError(f"DistributedDataParallel: the module lives on {sorted(devices)}, the "
                             f"{communicator.backend} backend works on {communicator.device}")
        self.module = module
        with autograd.no_grad():
            for t in (*module.parameters(), *module.buffers()):
                collectives.broadcast(t, src=0)
        self.reducer = GradReducer(params, int(bucket_mb * 2**20), communicator)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation: backward passes inside only add to the gradients; the
        first backward after the block averages everything accumulated."""
        with self.reducer.no_sync():
            yield
