"""Grouping: the few-row products of one input run as one call.

A UNet's ResBlocks each project the same time embedding: ``matmul_bias_act(e, w_i.T,
b_i, act_i)`` once per block, with ``e`` one row per sample.  Each such product reads a
weight and writes a handful of values, so its time is a kernel launch, not the work.
The pass replaces every set of two or more ``matmul_bias_act(a, b, bias, act)`` calls
(or plain ``matmul(a, b)``: no bias, no activation) that read the same ``a`` of at most
``FEW_ROWS`` rows by one ``matmul_bias_act_group(a, ((b, bias, act), ...))`` at the
first one's place, returning their results (the same values) as a tuple;
a backend may run them in one launch (the CuPy backend does), each result bit for bit
what its own call computes.

A call joins the group only when it can move up to the first one's place: it writes
nothing in place, its result is a block of its own, the arrays it reads already exist
there (the program's parameters, or results of earlier calls) and nothing in between
writes them.
"""

from __future__ import annotations

import dataclasses
import math

from ..graph import Graph, Node, Ref, node_refs
from .uses import Uses, owns_block, rewritten

FEW_ROWS = 8  # a product of at most this many rows is latency-bound on every backend


def group_linear(graph: Graph) -> Graph:
    values = graph.values
    uses = Uses.of(graph, values)
    made_at = {s.index: s.producer for s in graph.storages if s.kind == "fresh"}
    positions = {node.index: p for p, node in enumerate(graph.nodes)}
    groups: dict[int, list[tuple[int, Node, tuple]]] = {}  # a's value -> (position, call, product) of each
    for position, node in enumerate(graph.nodes):
        found = _product(graph, node, values)
        if found is None:
            continue
        a, product = found
        members = groups.setdefault(a.value, [])
        if members:
            first = members[0][0]
            reads = {values[r.value].storage for r in node_refs(node)}
            if not (all(positions.get(made_at.get(s), -1) < first for s in reads)
                    and uses.unwritten(reads, first, position)):
                continue
        members.append((position, node, product))
    placed: dict[int, Node | None] = {}
    storages = list(graph.storages)
    grouped = 0
    for a, members in groups.items():
        if len(members) < 2:
            continue
        (first, lead, _), *_ = members
        outs = tuple(node.out for _, node, _ in members)
        placed[first] = Node(lead.index, "matmul_bias_act_group", (Ref(a), tuple(p for *_, p in members)), {}, outs)
        for position, node, _ in members[1:]:
            placed[position] = None
            s = values[node.out.value].storage
            storages[s] = dataclasses.replace(storages[s], producer=lead.index)
        grouped += len(members)
    if not grouped:
        return graph
    return rewritten(graph, placed, "group_linear", grouped, storages=storages)


def _product(graph: Graph, node: Node, values: list) -> tuple[Ref, tuple] | None:
    """(a, (b, bias, act)) when ``node`` is ``matmul_bias_act(a, b, bias, act)`` or
    ``matmul(a, b)`` of a 2-D b and at most FEW_ROWS rows of a, that writes nothing in
    place and returns a block of its own; else None."""
    if node.kwargs or node.writes or node.effect:
        return None
    if node.op == "matmul_bias_act" and len(node.args) == 4 and isinstance(node.args[3], str):
        a, b, bias, act = node.args
    elif node.op == "matmul" and len(node.args) == 2:
        (a, b), bias, act = node.args, None, "none"
    else:
        return None
    if type(a) is not Ref or type(b) is not Ref or len(values[b.value].shape) != 2 \
            or not owns_block(graph, node, values):
        return None
    rows = values[a.value].shape[:-1]
    return (a, (b, bias, act)) if len(rows) >= 1 and math.prod(rows) <= FEW_ROWS else None
