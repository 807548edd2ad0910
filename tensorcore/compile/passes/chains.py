"""What the pattern-rewrite passes (attention fusion, the LoRA rewrite) share: finding
the call that made a private intermediate, peeling scalings by Python numbers, and
checking that a chain's operands may be read at its last call.

A value is a *private intermediate* of the call reading it when the rules of
``fuse_elementwise`` hold: it is the only result of the call that made it, a block of
its own, read by that one reader alone (no other call, no other view), not returned.
Replacing the chain from it to its reader by one call then changes nothing anybody sees.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph import Graph, Node, Ref, Value
from .fuse_elementwise import owns_block, sole_reader, unwritten, usage


def is_call(node: Node, op: str, arrays: int) -> bool:
    """Whether ``node`` calls ``op`` on ``arrays`` array arguments and nothing else."""
    return (node.op == op and not node.kwargs and len(node.args) == arrays
            and all(type(a) is Ref for a in node.args))


def scaling(node: Node, values: list[Value]) -> tuple[float | None, int]:
    """(factor, operand) when the call multiplies an array by a finite Python number or
    divides it by a non-zero one, keeping its shape and dtype; else (None, -1)."""
    if node.op != "binary" or node.kwargs or len(node.args) != 3 or node.args[0] not in ("mul", "div"):
        return None, -1
    op, a, b = node.args
    if type(a) is not Ref and op == "mul":
        a, b = b, a
    if type(a) is not Ref or not _is_number(b):
        return None, -1
    x, out = values[a.value], values[node.out.value]
    if (x.shape, x.dtype) != (out.shape, out.dtype) or (op == "div" and float(b) == 0.0):
        return None, -1
    return (float(b) if op == "mul" else 1.0 / float(b)), a.value


def _is_number(x: Any) -> bool:
    return (type(x) in (int, float) or isinstance(x, (np.integer, np.floating))) and bool(np.isfinite(x))


class Chains:
    """A graph's readers and writers, for matching chains of private intermediates."""

    def __init__(self, graph: Graph, values: list[Value]) -> None:
        self.graph, self.values = graph, values
        self.readers, self.writes, self.returned = usage(graph, values)
        self.position = {node.index: p for p, node in enumerate(graph.nodes)}

    def producer(self, v: int, reader: int) -> int | None:
        """The position of the call that made value ``v`` when ``v`` is a private
        intermediate of the call at position ``reader``, else None."""
        s = self.graph.storages[self.values[v].storage]
        p = self.position.get(s.producer) if s.kind == "fresh" else None
        if p is None:
            return None
        node = self.graph.nodes[p]
        if node.out != Ref(v) or node.writes or node.effect or not owns_block(self.graph, node, self.values):
            return None
        if not sole_reader(self.values, v, self.graph.nodes[reader], reader, self.readers, self.returned):
            return None
        return p

    def peel_scales(self, v: int, reader: int, positions: list[int]) -> tuple[int, float]:
        """(the value under the private scalings of ``v`` by Python numbers, the product
        of their factors); the scaling calls' positions are appended to ``positions``."""
        scale = 1.0
        while (p := self.producer(v, reader)) is not None:
            factor, operand = scaling(self.graph.nodes[p], self.values)
            if factor is None:
                break
            positions.append(p)
            scale *= factor
            v, reader = operand, p
        return v, scale

    def readable(self, operands: list[int], positions: list[int]) -> bool:
        """Whether a call at the last of ``positions`` (sorted) may read ``operands`` in
        place of the chain at ``positions``: none of them is a result of the chain, and
        no call in between writes their memory."""
        values, nodes = self.values, self.graph.nodes
        made = {values[r.value].storage for p in positions for r in (nodes[p].out,) if type(r) is Ref}
        if made & {values[i].storage for i in operands}:
            return False
        return unwritten(values, operands, positions[0], positions[-1], self.writes)
