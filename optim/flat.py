"""Flat, 256-byte-aligned device buffers that hold parameters, gradients and state.

One ``FlatBuffer`` per (device, dtype) holds a *section* per role -- ``"param"``,
``"grad"`` and one per optimizer state (``"exp_avg"``, ...) -- all of the same length.
Every parameter owns the same range in every section, starting on a 256-byte
boundary; the gaps between ranges are zeros and stay zeros (a zero gradient, zero
state and a zero parameter are a fixed point of every update rule here), so a kernel
may run over a whole range, gaps included.

A ``Segment`` is the part of a buffer that belongs to one param group: a contiguous
range of every section, updated by one kernel call per step.

With sharded state (``sharding.py``) a buffer's state sections hold only this rank's
slice of the elements, and ``Segment.section`` gives the part of a range this rank
updates.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from tensorcore import Tensor, tracing

if TYPE_CHECKING:
    from .sharding import Shard

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


WHOLE_ROLES = ("param", "grad")  # sections every process holds whole, sharded or not


class FlatBuffer:
    """One aligned allocation holding a section of ``length`` elements per role.

    With a ``shard`` (``sharding.py``) this process updates elements ``[lo, hi)`` only:
    the parameter and gradient sections stay whole, every state section holds just
    that slice (its element i is element lo + i of the whole)."""

    def __init__(self, backend: Any, dtype: Any, length: int, roles: Sequence[str],
                 shard: Shard | None = None) -> None:
        self.backend = backend
        self.dtype = np.dtype(dtype)
        self.length = length
        self.roles = tuple(roles)
        self.shard = shard
        self.lo, self.hi = shard.bounds(length) if shard is not None else (0, length)
        lengths = [length if role in WHOLE_ROLES else self.hi - self.lo for role in self.roles]
        slack = ALIGN_BYTES // self.dtype.itemsize
        self.storage = backend.zeros((sum(lengths) + slack,), self.dtype)
        self.zero = backend.zeros((1,), self.dtype)
        start = (-address(self.storage) % ALIGN_BYTES) // self.dtype.itemsize
        self.sections = {}
        for role, n in zip(self.roles, lengths):
            self.sections[role] = self.storage[start:start + n]
            start += n

    def owned_range(self, start: int, stop: int) -> tuple[int, int]:
        """The part of elements ``[start, stop)`` this process updates (maybe empty)."""
        lo, hi = max(start, self.lo), min(stop, self.hi)
        return lo, max(lo, hi)

    def owned(self, role: str, start: int, stop: int) -> Any:
        """That part of section ``role``, as a view."""
        lo, hi = self.owned_range(start, stop)
        base = 0 if role in WHOLE_ROLES else self.lo
        return self.sections[role][lo - base:hi - base]

    def whole(self, role: str) -> Any:
        """Section ``role`` over every element: with a shard, a state section is gathered
        from all ranks (a collective: every rank must ask)."""
        if self.shard is None or role in WHOLE_ROLES:
            return self.sections[role]
        whole = self.backend.empty((self.length,), self.dtype)
        self.shard.gather(self.backend, whole, self.sections[role])
        return whole

    def gather_params(self) -> None:
        """With a shard: every rank's updated slice of the parameters, to every rank."""
        if self.shard is not None:
            params = self.sections["param"]
            self.shard.gather(self.backend, params, params[self.lo:self.hi])


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
        """The flat range of ``role`` covering parameters ``first .. last - 1`` (the part of
        it this process updates, when the buffer is sharded)."""
        last = len(self.params) if last is None else last
        return self.buffer.owned(role, self.offsets[first], self.ends[last - 1])

    def owns(self, first: int, last: int) -> bool:
        """Whether this process updates any element of parameters ``first .. last - 1``."""
        lo, hi = self.buffer.owned_range(self.offsets[first], self.ends[last - 1])
        return hi > lo

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
        backend.concatenate(pieces, 0, out=self.buffer.sections["grad"][self.start:self.stop])
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
