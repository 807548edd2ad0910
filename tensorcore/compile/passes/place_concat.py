"""Concatenation by placement: the calls that make a concatenation's parts write them
where the concatenation puts them, and the copy goes.

A UNet's up path concatenates each block's input with a skip connection along the
channels: ``c = concatenate((h, skip), 1)``.  With one sample (every axis before the
joined one of size 1), each part is one contiguous byte range of c.  When every part
is the result of a ``conv2d``, ``group_norm_conv2d`` or ``upsample_conv2d`` call (the
ops whose ``out=`` the backend protocol guarantees) and is a block of its own that nothing writes
later and the program does not return, the pass

* allocates c first: an ``empty(shape, dtype)`` call just before the first part's
  producer (c's storage, marked written);
* makes every part a view of its range of c (every view of the part's block moves with
  it), so later readers of the part read c's memory;
* hands each producer its range as ``out=`` (it now writes c in place);
* drops the concatenate call.

The values are unchanged, only where they live; the concatenation's copies (two reads
and two writes of every part on the GPU) are gone.  It runs last: it changes memory,
which the fusion passes' tests of "a block of its own" look at.
"""

from __future__ import annotations

import dataclasses
import math

from ..graph import Graph, Node, Ref
from .uses import Uses, owns_block

PRODUCERS = frozenset({"conv2d", "group_norm_conv2d", "upsample_conv2d"})


def place_concat(graph: Graph) -> Graph:
    values = list(graph.values)
    storages = list(graph.storages)
    nodes: list[Node | None] = list(graph.nodes)
    uses = Uses.of(graph, graph.values)
    positions = {node.index: p for p, node in enumerate(graph.nodes)}
    allocations: dict[int, Node] = {}  # position -> the empty() call placed before it
    taken: set[int] = set()  # storages of parts already placed
    placed = 0
    for position, node in enumerate(graph.nodes):
        parts = _parts(graph, node, uses, positions, taken)
        if parts is None:
            continue
        first = min(p for p, _, _ in parts)
        if first in allocations:
            continue
        c = graph.values[node.out.value]
        allocations[first] = Node(node.index, "empty", (c.shape, c.dtype), {}, node.out)
        storages[c.storage] = dataclasses.replace(storages[c.storage], written=True)
        for producer_position, part, offset in parts:
            old = graph.values[part].storage
            taken.add(old)
            for v in graph.values:  # every view of the part's block moves with it
                if v.storage == old:
                    values[v.index] = dataclasses.replace(v, storage=c.storage, offset=c.offset + offset + v.offset)
            producer = graph.nodes[producer_position]
            nodes[producer_position] = Node(producer.index, producer.op, producer.args,
                                            {**producer.kwargs, "out": Ref(part)}, producer.out,
                                            writes=(c.storage,))
        nodes[position] = None
        placed += 1
    if not placed:
        return graph
    ordered = []
    for position, node in enumerate(nodes):
        if position in allocations:
            ordered.append(allocations[position])
        if node is not None:
            ordered.append(node)
    ordered, storages = _renumbered(ordered, storages)
    stats = {**graph.stats, "place_concat": graph.stats.get("place_concat", 0) + placed}
    return dataclasses.replace(graph, nodes=ordered, values=values, storages=storages, stats=stats)


def _renumbered(nodes: list[Node], storages: list) -> tuple[list[Node], list]:
    """The calls numbered by position (an allocation moved up took a later call's
    number; numbers must rise in program order), each storage's producer renumbered with
    its call (None where that call is gone: nothing reads such a storage)."""
    number = {node.index: i for i, node in enumerate(nodes)}
    nodes = [dataclasses.replace(node, index=i) for i, node in enumerate(nodes)]
    storages = [s if s.producer is None else dataclasses.replace(s, producer=number.get(s.producer))
                for s in storages]
    return nodes, storages


def _parts(graph: Graph, node: Node, uses: Uses, positions: dict[int, int],
           taken: set[int]) -> list[tuple[int, int, int]] | None:
    """(producer position, value, byte offset in the result) of each part when ``node``
    is a concatenation the pass can place (see the module doc), else None."""
    values = graph.values
    if node.op != "concatenate" or len(node.args) != 2 or node.kwargs or not owns_block(graph, node, values):
        return None
    arrays, axis = node.args
    c = values[node.out.value]
    if not isinstance(arrays, (tuple, list)) or type(axis) is not int or not -len(c.shape) <= axis < len(c.shape):
        return None
    axis %= len(c.shape)
    if math.prod(c.shape[:axis]) != 1 or len(set(arrays)) != len(arrays):
        return None
    inner = math.prod(c.shape[axis + 1:]) * c.dtype.itemsize
    parts, offset = [], 0
    for r in arrays:
        if type(r) is not Ref:
            return None
        v = values[r.value]
        storage = graph.storages[v.storage]
        position = positions.get(storage.producer) if storage.kind == "fresh" else None
        if position is None or v.storage in taken or v.storage in uses.returned or v.dtype != c.dtype:
            return None
        producer = graph.nodes[position]
        if producer.op not in PRODUCERS or producer.out != r or "out" in producer.kwargs \
                or producer.writes or not owns_block(graph, producer, values):
            return None
        parts.append((position, r.value, offset))
        offset += v.shape[axis] * inner
    return parts
