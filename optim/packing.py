"""Packing an optimizer's parameters into flat buffers, and re-packing after a change.

``pack`` lays out every (device, dtype) of the param groups in a ``FlatBuffer``,
copies parameter values, gradients and any existing state into it and rebinds each
``Parameter.data`` (and existing ``.grad``) to its view.  Re-packing (after
``add_param_group``) carries over the state and step counts of known parameters.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import numpy as np

from tensorcore import Tensor
from tensorcore.backends import backend_for

from .flat import FlatBuffer, Segment, layout
from .sharding import Shard

StateSpec = Callable[[dict], dict[str, float]]  # group -> {state role: initial value}

_OWNERS: dict[int, weakref.ref] = {}  # id(parameter) -> the Packing holding it


class Packing:
    """All buffers and segments of one optimizer."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, np.dtype], FlatBuffer] = {}
        self.segments: list[Segment] = []
        self.by_group: list[list[Segment]] = []
        self.owner: dict[int, tuple[Segment, int]] = {}

    def locate(self, p: Tensor) -> tuple[Segment, int] | None:
        """The segment holding ``p`` and its index there, or None."""
        found = self.owner.get(id(p))
        return found if found is not None and found[0].params[found[1]] is p else None


def pack(groups: Sequence[dict], state_spec: StateSpec, previous: Packing | None, shard: Shard | None = None
         ) -> Packing:
    """Build the buffers for ``groups``; ``state_spec(group)`` names each state role the
    group's update uses and its initial value; ``shard`` (``sharding.py``) keeps this
    rank's slice of the state only."""
    packing = Packing()
    packing.by_group = [[] for _ in groups]
    keys: list[tuple[str, np.dtype]] = []
    for group in groups:
        for p in group["params"]:
            key = (p.device, np.dtype(p.dtype))
            if key not in keys:
                keys.append(key)
    for device, dtype in keys:
        members = [[p for p in g["params"] if p.device == device and np.dtype(p.dtype) == dtype] for g in groups]
        offsets, stops, length = layout(members, dtype)
        if shard is not None:
            length = shard.padded(length, np.dtype(dtype).itemsize)
        roles = ["param", "grad"]
        for group, params in zip(groups, members):
            if params:
                roles += [r for r in state_spec(group) if r not in roles]
        buffer = FlatBuffer(backend_for(device), dtype, length, roles, shard)
        packing.buffers[(device, dtype)] = buffer
        for gi, (group, params) in enumerate(zip(groups, members)):
            if params:
                segment = Segment(buffer, gi, params, offsets[gi], stops[gi], float(group["lr"]))
                _fill(segment, state_spec(group), previous)
                packing.segments.append(segment)
                packing.by_group[gi].append(segment)
                for i, p in enumerate(params):
                    packing.owner[id(p)] = (segment, i)
                    _OWNERS[id(p)] = weakref.ref(packing)
    return packing


def packing_of(p: Tensor) -> Packing | None:
    """The live packing whose flat buffers hold ``p``, if any."""
    ref = _OWNERS.get(id(p))
    packing = ref() if ref is not None else None
    return packing if packing is not None and packing.locate(p) is not None else None


def _fill(segment: Segment, spec: dict[str, float], previous: Packing | None) -> None:
    """Initial state, then values, gradients and carried-over state of every parameter."""
    backend = segment.buffer.backend
    for role, value in spec.items():
        if value != 0:
            for i, (offset, size) in enumerate(zip(segment.offsets, segment.sizes)):
                backend.copy_(segment.buffer.owned(role, offset, offset + size),
                              backend.full((1,), value, segment.buffer.dtype))
    for i, p in enumerate(segment.params):
        backend.copy_(segment.param_views[i], p.data)
        p.data = segment.param_views[i]
        if p.grad is not None:
            backend.copy_(segment.grad_views[i], p.grad.data)
            p.grad = Tensor(segment.grad_views[i], segment.device)
        old = previous.locate(p) if previous is not None else None
        if old is not None:
            _carry_state(old, segment, i, spec)


def _carry_state(old: tuple[Segment, int], segment: Segment, i: int, spec: dict[str, float]) -> None:
    old_segment, j = old
    backend = segment.buffer.backend
    for role in spec:
        if role in old_segment.buffer.sections:
            backend.copy_(segment.section(role, i, i + 1), old_segment.section(role, j, j + 1))
    segment.set_count(i, old_segment.counts[j])


def state_arrays(segment: Segment, i: int, sections: dict[str, Any]) -> dict[str, Any]:
    """Host copies of parameter i's state, shaped like the parameter, from the whole
    sections of its buffer (``FlatBuffer.whole``) by role."""
    backend = segment.buffer.backend
    shape = tuple(segment.params[i].data.shape)
    lo, hi = segment.offsets[i], segment.offsets[i] + segment.sizes[i]
    return {role: np.array(backend.to_numpy(section[lo:hi])).reshape(shape) for role, section in sections.items()}
