"""Gradient buckets: averaging a model's gradients over the ranks while backward runs.

The parameters are cut into *buckets* of at most ``bucket_bytes`` of one dtype, in
reverse registration order (backward produces the last layers' gradients first).  A
post-accumulate-grad hook on every parameter counts the gradients a bucket still
waits for; when a bucket is complete, and every bucket before it has been launched
(all ranks must issue their collectives in one order), its all-reduce (average) is
started with ``overlap=True``: on a side stream on the GPU, as a pending request with
MPI, so it travels while the rest of backward computes.  A callback queued at the end
of the backward pass launches any bucket left over (parameters that got no gradient)
and waits for all of them.

Where a bucket's gradients are views of one flat buffer, back to back but for the
alignment padding between them (the optimizers' flat buffers after
``zero_grad(set_to_none=False)``: see ``optim/flat.py``), the bucket is reduced in place
as one slice of that buffer, padding included (zeros stay zeros).  Otherwise its
gradients are concatenated into a staging array, reduced, and copied back; a
parameter without a gradient contributes zeros and receives the average.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import numpy as np

from .. import autograd, tracing, versions
from ..backends.geometry import address
from ..tensor import Tensor

PADDING_BYTES = 256  # the optimizers' flat buffers start every parameter on a 256-byte boundary


def plan_buckets(params: Sequence[Tensor], bucket_bytes: int) -> list[list[int]]:
    """Parameter indices in reverse order, cut into runs of one dtype and device of at most
    ``bucket_bytes`` (a parameter larger than that is a bucket of its own)."""
    buckets: list[list[int]] = []
    size = 0
    for i in reversed(range(len(params))):
        p = params[i]
        nbytes = p.numel() * p.dtype.itemsize
        last = params[buckets[-1][-1]] if buckets else None
        if last is None or (last.dtype, last.device) != (p.dtype, p.device) or size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets


class GradReducer:
    """Averages the gradients of ``params`` over ``communicator``'s ranks in every backward."""

    def __init__(self, params: Sequence[Tensor], bucket_bytes: int, communicator: Any) -> None:
        self.params = list(params)
        self.communicator = communicator
        self.buckets = plan_buckets(self.params, bucket_bytes)
        self.bucket_of = {id(self.params[i]): k for k, bucket in enumerate(self.buckets) for i in bucket}
        self.sync = True
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._ready)
        self._start_pass()

    def _start_pass(self) -> None:
        self.waiting = [len(bucket) for bucket in self.buckets]  # gradients each bucket still waits for
        self.launched = 0  # buckets launched, in order
        self.reduced: list[Any] = []  # the arrays the launched collectives write
        self.staged: list[tuple[list[int], Any]] = []  # (bucket, staging array) to copy back

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients; the first one after averages them."""
        previous, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = previous

    def _ready(self, p: Tensor) -> None:
        """A parameter's gradient is complete: launch every bucket that became ready."""
        if autograd.queue_callback(self._finish):  # the pass's first gradient
            self._start_pass()
            sync = self.sync
            tracing.guard(lambda: self.sync == sync)  # a compiled step recorded with or without averaging
        if not self.sync:
            return
        self.waiting[self.bucket_of[id(p)]] -= 1
        while self.launched < len(self.buckets) and self.waiting[self.launched] == 0:
            self._launch(self.launched)

    def _finish(self) -> None:
        """End of backward: launch what is left, wait for everything, copy back."""
        if self.sync:
            while self.launched < len(self.buckets):
                self._launch(self.launched)
            backend = self.params[0].backend
            backend.collective_(tuple(self.reduced), None, self.communicator, "wait")
            for bucket, staging in self.staged:
                self._unstage(bucket, staging)
            for array in self.reduced:
                versions.bump(array)

    def _launch(self, k: int) -> None:
        bucket = self.buckets[k]
        backend = self.params[bucket[0]].backend
        span = _span([self.params[i].grad for i in bucket])
        if span is None:
            span = self._stage(bucket)
            self.staged.append((bucket, span))
        backend.collective_(span, span, self.communicator, "all_reduce", reduce="avg", overlap=True)
        self.reduced.append(span)
        self.launched += 1

    def _stage(self, bucket: list[int]) -> Any:
        """The bucket's gradients in one new array (zeros for a missing gradient)."""
        backend = self.params[bucket[0]].backend
        pieces = [backend.reshape(p.grad.data, (-1,)) if p.grad is not None else backend.zeros((p.numel(),), p.dtype)
                  for p in (self.params[i] for i in bucket)]
        return backend.concatenate(pieces, 0)

    def _unstage(self, bucket: list[int], staging: Any) -> None:
        start = 0
        for p in (self.params[i] for i in bucket):
            backend = p.backend
            part = backend.reshape(staging[start:start + p.numel()], p.shape)
            start += p.numel()
            if p.grad is None:
                p.grad = Tensor._wrap(part, p.device)
            else:
                backend.copy_(p.grad.data, part)
                versions.bump(p.grad.data)


def _span(grads: list[Tensor | None]) -> Any:
    """One view of the memory that holds exactly these gradients back to back (padding
    between them allowed), or None."""
    if any(g is None for g in grads):
        return None
    arrays = [g.data for g in grads]
    root = versions.storage(arrays[0])
    if not root.flags.c_contiguous or any(versions.storage(a) is not root or not a.flags.c_contiguous
                                          or a.dtype != arrays[0].dtype for a in arrays):
        return None
    pieces = sorted((address(a), address(a) + a.nbytes) for a in arrays)
    if any(not 0 <= nxt[0] - prev[1] < PADDING_BYTES for prev, nxt in zip(pieces, pieces[1:])):
        return None
    base = address(root)
    memory = root.reshape(-1).view(np.uint8)
    return memory[pieces[0][0] - base:pieces[-1][1] - base].view(arrays[0].dtype)
