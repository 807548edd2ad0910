"""Flat, 256-byte-aligned device buffers that hold parameters, gradients and state.

One ``FlatBuffer`` per (device, dtype) holds a *section* per role -- ``"param"``,
``"grad"`` and one per optimizer state (``"exp_avg"``, ...) -- all of the same length.
Every parameter owns the same range in every section, starting on a 256-byte
boundary; the gaps between ranges are zeros and stay zeros (a zero gradient, zero
state and a zero parameter are a fixed point of every update rule here), so a kernel
may run over a whole range, gaps included.

A ``Segment`` is the part of a buffer that belongs to one param group: a contiguous
range of every section, updated by one kernel call per step.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np

from tensorcore import Tensor, tracing

ALIGN_BYTES = 256


def align_up(n: int, itemsize: int) -> int:
    """``n`` elements rounded up to a whole number of 256-byte blocks."""
    per_block = ALIGN_BYTES // itemsize
    return -(-n // per_block) * per_block


def address(a: Any) -> int:
    """The device (or host) address of an array's first element."""
    interface = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
    return int(interface["data"][0])


def scalar_dtype(dtype: Any) -> np.dtype:
    """The dtype of the device scalars (lr, step) that drive updates of ``dtype``
    parameters: float64 for float64 parameters, float32 otherwise."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


class FlatBuffer:
    """One aligned allocation holding a section of ``length`` elements per role."""

    def __init__(self, backend: Any, dtype: Any, length: int, roles: Sequence[str]) -> None:
        self.backend = backend
        self.dtype = np.dtype(dtype)
        self.length = length
        self.roles = tuple(roles)
        slack = ALIGN_BYTES // self.dtype.itemsize
        self.storage = backend.zeros((len(self.roles) * length + slack,), self.dtype)
        self.zero = backend.zeros((1,), self.dtype)
        base = (-address(self.storage) % ALIGN_BYTES) // self.dtype.itemsize
        self.sections = {role: self.storage[base + i * length: base + (i + 1) * length]
                         for i, role in enumerate(self.roles)}


class Segment:
    """The parameters of one param group that share a dtype, and their device scalars.

    ``offsets[i]`` is where parameter i starts in every section; the segment spans
    ``[start, stop)``.  ``lr`` is a 1-element device array; ``steps`` holds one step
    count per parameter on the device, ``counts`` the same counts on the host (they
    decide which parameters one kernel call may cover without reading the device).
    """

    def __init__(self, buffer: FlatBuffer, group_index: int, params: Sequence[Tensor],
                 offsets: Sequence[int], stop: int, lr: float) -> None:
        backend = buffer.backend
        self.buffer = buffer
        self.group_index = group_index
        self.params = list(params)
        self.offsets = list(offsets)
        self.start, self.stop = self.offsets[0], stop
        self.ends = self.offsets[1:] + [stop]
        self.sizes = [int(p.data.size) for p in self.params]
        self.device = self.params[0].device
        sdt = scalar_dtype(buffer.dtype)
        self.lr = backend.full((1,), lr, sdt)
        self.lr_seen = lr
        self.steps = backend.zeros((len(self.params),), sdt)
        self.counts = [0] * len(self.params)
        self.uniform = True  # all counts equal: one kernel call may cover the segment
        self.one = backend.full((1,), 1, sdt)
        self.zero = backend.full((1,), 0, sdt)
        self.param_views = [self._shaped("param", i) for i in range(len(self.params))]
        self.grad_views = [self._shaped("grad", i) for i in range(len(self.params))]
        self.bounded = [(view, p.bounds) for view, p in zip(self.param_views, self.params)
                        if getattr(p, "bounds", None) not in (None, (None, None))]
        self._zeros: Any = None
        self._ranges: dict[tuple[int, int], Any] = {}

    def _shaped(self, role: str, i: int) -> Any:
        flat = self.buffer.sections[role][self.offsets[i]: self.offsets[i] + self.sizes[i]]
        return self.buffer.backend.reshape(flat, tuple(self.params[i].data.shape))

    def section(self, role: str, first: int = 0, last: int | None = None) -> Any:
        """The flat range of ``role`` covering parameters ``first .. last - 1``."""
        last = len(self.params) if last is None else last
        return self.buffer.sections[role][self.offsets[first]: self.ends[last - 1]]

    def ranges(self, first: int, last: int) -> Any:
        """A device int64 array [last - first, 2] of each parameter's (start, stop) in
        ``section(role, first, last)``, for the updates that need per-tensor norms."""
        key = (first, last)
        if key not in self._ranges:
            base = self.offsets[first]
            pairs = [[o - base, o - base + s] for o, s in zip(self.offsets[first:last], self.sizes[first:last])]
            self._ranges[key] = self.buffer.backend.from_numpy(np.array(pairs, dtype=np.int64).reshape(-1, 2))
        return self._ranges[key]

    def gather_grads(self) -> None:
        """Copy every gradient that is not already a view of the grad section into it
        (one concatenation written straight into the section) and make ``.grad`` that
        view; a missing gradient leaves zeros and stays ``None``."""
        backend = self.buffer.backend
        if self._zeros is None:
            self._zeros = backend.zeros((max(e - o for o, e in zip(self.offsets, self.ends)),), self.buffer.dtype)
        pieces = []
        for p, size, gap in zip(self.params, self.sizes, (e - o for o, e in zip(self.offsets, self.ends))):
            pieces.append(backend.reshape(p.grad.data, (size,)) if p.grad is not None else self._zeros[:size])
            if gap > size:
                pieces.append(self._zeros[:gap - size])
        backend.concatenate(pieces, 0, out=self.section("grad"))
        grads = [(p, Tensor(view, self.device)) for p, view in zip(self.params, self.grad_views) if p.grad is not None]
        tracing.host_effect(functools.partial(_set_grads, grads))

    def advance(self, first: int, last: int) -> None:
        """Count one step on the host for parameters ``first .. last - 1``."""
        count = self.counts[first] + 1
        self.counts[first:last] = [count] * (last - first)
        if last - first != len(self.counts):
            self.uniform = len(set(self.counts)) == 1

    def set_count(self, i: int, count: int) -> None:
        """Set parameter i's step count on the host and on the device."""
        self.counts[i] = count
        self.uniform = len(set(self.counts)) == 1
        backend = self.buffer.backend
        backend.copy_(self.steps[i:i + 1], backend.full((1,), count, self.steps.dtype))

    def all_bound(self) -> bool:
        """Whether every parameter and every gradient is its view of the buffer."""
        for p, view, grad_view in zip(self.params, self.param_views, self.grad_views):
            grad = p.grad
            if p.data is not view or grad is None or grad.data is not grad_view:
                return False
        return True

    def grads_are_views(self) -> bool:
        return all(p.grad is None or p.grad.data is view for p, view in zip(self.params, self.grad_views))


def _set_grads(grads: Sequence[tuple[Tensor, Tensor]]) -> None:
    for p, grad in grads:
        p.grad = grad


def layout(groups: Sequence[Sequence[Tensor]], dtype: Any) -> tuple[list[list[int]], list[int], int]:
    """Aligned offsets of every parameter of ``dtype`` in each group, each group's
    stop, and the section length."""
    itemsize = np.dtype(dtype).itemsize
    offsets: list[list[int]] = []
    stops: list[int] = []
    cursor = 0
    for params in groups:
        group_offsets = []
        for p in params:
            group_offsets.append(cursor)
            cursor += align_up(int(p.data.size), itemsize)
        offsets.append(group_offsets)
        stops.append(cursor)
    return offsets, stops, max(cursor, ALIGN_BYTES // itemsize)
