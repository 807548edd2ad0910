"""What the fusion passes ask of a graph before folding one call into another.

* ``Uses``: which calls read and write each storage, and which storages are returned --
  a result may be folded into the call that reads it only when that call is its one
  reader (no other call, no other view, not a returned value), and a call may be moved
  later only when nothing in between writes what it reads;
* ``Views``: the graph's values, extended with the new views a rewrite needs (a bias
  viewed along an axis, a shift viewed as [N, C]), one Value per distinct view;
* ``fresh_block``: whether a call's result is a C-contiguous block of its own that
  nothing writes later, so the fused call may produce it instead (``owns_block``: and
  it is the call's one result);
* ``full_call``: the ``full`` call that made a one-element array (``2 * y`` traces one
  for the 2), whose number a fused call may take instead;
* ``rewritten``: the graph with calls replaced or dropped by position;
* ``call_arguments``: a backend call's arguments by name;
* ``conv_of_input``: a ``conv2d`` call split into its input and the rest, when that
  input is a result the conv alone reads, and only as its input;
* ``ACTS``: the activations a fused call applies (every one but "none").
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, Iterable

import numpy as np

from ...backends.base import ACTIVATIONS, Backend
from ..graph import Graph, Node, Ref, Value, node_refs
from ..plan import made_by

ACTS = frozenset(ACTIVATIONS) - {"none"}


@dataclasses.dataclass
class Uses:
    """``readers``: storage -> positions of the calls reading it; ``writes``: storage ->
    positions of the calls writing it in place; ``returned``: the storages of outputs."""

    readers: dict[int, set[int]]
    writes: dict[int, list[int]]
    returned: set[int]

    @classmethod
    def of(cls, graph: Graph, values: list[Value]) -> "Uses":
        readers: dict[int, set[int]] = {}
        writes: dict[int, list[int]] = {}
        for position, node in enumerate(graph.nodes):
            for r in node_refs(node):
                readers.setdefault(values[r.value].storage, set()).add(position)
            for s in node.writes:
                writes.setdefault(s, []).append(position)
        return cls(readers, writes, {values[r.value].storage for r in graph.output_refs()})

    def only_reader(self, values: list[Value], v: int, node: Node, position: int) -> bool:
        """Whether ``node`` (at ``position``) is the one reader of value ``v``: no other
        call reads its storage, ``node`` reads it through ``v`` alone, it is not returned."""
        storage = values[v].storage
        if storage in self.returned or self.readers.get(storage) != {position}:
            return False
        return not any(values[r.value].storage == storage and r.value != v for r in node_refs(node))

    def unwritten(self, storages: Iterable[int], first: int, position: int) -> bool:
        """Whether no call strictly between positions ``first`` and ``position`` writes
        any of ``storages`` (a call reading them may move from ``first`` to ``position``)."""
        return not any(first < w < position for s in storages for w in self.writes.get(s, ()))


class Views:
    """The graph's values plus the views a pass adds (``values`` grows in place)."""

    def __init__(self, values: list[Value]) -> None:
        self.values = list(values)
        self._index = {(v.storage, v.offset, v.shape, v.strides, v.dtype): v.index for v in self.values}

    def get(self, storage: int, offset: int, shape: tuple, strides: tuple, dtype: np.dtype) -> int:
        """The index of the value viewing ``storage`` so, made when there is none yet."""
        key = (storage, offset, shape, strides, dtype)
        if key not in self._index:
            self._index[key] = len(self.values)
            self.values.append(Value(len(self.values), *key))
        return self._index[key]


def rewritten(graph: Graph, placed: dict[int, Node | None], stat: str, count: int, **fields: Any) -> Graph:
    """``graph`` with the call at each position of ``placed`` replaced by its new call
    (None: dropped), ``count`` rewrites added to ``stats[stat]`` and ``fields`` (the
    grown values, changed storages) set."""
    nodes = [placed.get(p, node) for p, node in enumerate(graph.nodes)]
    stats = {**graph.stats, stat: graph.stats.get(stat, 0) + count}
    return dataclasses.replace(graph, nodes=[n for n in nodes if n is not None], stats=stats, **fields)


def call_arguments(signature: inspect.Signature, node: Node, defaults: bool = False) -> dict | None:
    """``node``'s arguments by name under a backend method's ``signature`` (those left
    out filled in with ``defaults``), or None when they do not bind to it."""
    try:
        bound = signature.bind(None, *node.args, **node.kwargs)
    except TypeError:
        return None
    if defaults:
        bound.apply_defaults()
    params = dict(bound.arguments)
    del params["self"]
    return params


_CONV = inspect.signature(Backend.conv2d)
_CONV_GEOMETRY = ("w", "stride", "padding", "dilation", "groups")


def conv_of_input(node: Node, position: int, uses: Uses, values: list[Value],
                  candidates: dict[int, Any]) -> tuple[Ref, tuple, dict] | None:
    """(x, (w, stride, padding, dilation, groups), epilogue keywords) of the ``conv2d``
    call ``node`` at ``position`` when its input x is one of the ``candidates`` values,
    of which it is the one reader (``Uses.only_reader``), reading it as its input alone
    (not as its residual too); else None.  A pass folding x's producer into the conv
    replaces the call with one taking the producer's arguments, the geometry and the
    epilogue."""
    if node.op != "conv2d" or type(node.out) is not Ref:
        return None
    conv = call_arguments(_CONV, node)
    x = conv.get("x") if conv else None
    if type(x) is not Ref or x.value not in candidates or not uses.only_reader(values, x.value, node, position) \
            or list(node_refs(node)).count(x) != 1:
        return None
    del conv["x"]
    return x, tuple(conv.pop(name) for name in _CONV_GEOMETRY), conv


def full_call(graph: Graph, values: list[Value], positions: dict[int, int], ref: Ref) -> int | None:
    """The position of the ``full(shape, number, dtype)`` call that made the one-element
    array ``ref`` (nothing writes it later), else None; ``positions``: node index ->
    position in ``graph.nodes``."""
    v = values[ref.value]
    storage = graph.storages[v.storage]
    position = positions.get(storage.producer) if storage.kind == "fresh" and not storage.written else None
    if position is None or math.prod(v.shape) != 1:
        return None
    node = graph.nodes[position]
    return position if node.op == "full" and len(node.args) == 3 and not node.kwargs else None


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The strides (bytes) of a C-contiguous array of ``shape``."""
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def fresh_block(graph: Graph, node: Node, out: Value) -> bool:
    """Whether ``out`` is the whole of a block ``node`` allocated, C-contiguous, that no
    call writes in place."""
    storage = graph.storages[out.storage]
    return (out.storage in made_by(graph, node) and not storage.written
            and out.offset == 0 and storage.origin == 0 and out.strides == c_strides(out.shape, out.dtype.itemsize)
            and out.nbytes == storage.nbytes)


def owns_block(graph: Graph, node: Node, values: list[Value]) -> bool:
    """Whether ``node`` returns one array, and it is a fresh block of its own
    (``fresh_block``): the only memory the call makes."""
    if type(node.out) is not Ref:
        return False
    out = values[node.out.value]
    return made_by(graph, node) == {out.storage} and fresh_block(graph, node, out)
