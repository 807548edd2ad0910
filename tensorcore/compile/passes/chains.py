"""What the pattern-rewrite passes (attention fusion, the LoRA rewrite) share: finding
the call that made a private intermediate, peeling scalings by numbers, and
checking that a chain's operands may be read at its last call.

A value is a *private intermediate* of the call reading it when the rules of
``fuse_elementwise`` hold: it is the only result of the call that made it, a block of
its own, read by that one reader alone (no other call, no other view), not returned.
Replacing the chain from it to its reader by one call then changes nothing anybody sees.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...dtypes import is_floating
from ..graph import Graph, Node, Ref
from .uses import Uses, Views, full_call, owns_block

DTYPES = ("float16", "bfloat16", "float32", "float64")  # what the fused calls take


def is_call(node: Node, op: str, arrays: int) -> bool:
    """Whether ``node`` calls ``op`` on ``arrays`` array arguments and nothing else."""
    return (node.op == op and not node.kwargs and len(node.args) == arrays
            and all(type(a) is Ref for a in node.args))


def _is_number(x: Any) -> bool:
    """Whether ``x`` is a finite int or float (bools are not numbers here)."""
    if not (type(x) in (int, float) or isinstance(x, (np.integer, np.floating))):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


class Chains:
    """A graph's readers and writers, for matching chains of private intermediates;
    views the matching needs are added to ``values``."""

    def __init__(self, graph: Graph) -> None:
        views = Views(graph.values)
        self.graph, self.values, self.view = graph, views.values, views.get
        self.uses = Uses.of(graph, self.values)
        self.position = {node.index: p for p, node in enumerate(graph.nodes)}

    def producer(self, v: int, reader: int, views: bool = False) -> int | None:
        """The position of the call that made value ``v`` when ``v`` is a private
        intermediate of the call at position ``reader`` -- the call's result itself, or
        with ``views`` any view of it --, else None."""
        s = self.graph.storages[self.values[v].storage]
        p = self.position.get(s.producer) if s.kind == "fresh" else None
        if p is None:
            return None
        node = self.graph.nodes[p]
        if type(node.out) is not Ref or node.writes or node.effect or not owns_block(self.graph, node, self.values):
            return None
        if node.out.value != v and not views:
            return None
        if not self.uses.only_reader(self.values, v, self.graph.nodes[reader], reader):
            return None
        return p

    def number(self, x: Any, reader: int) -> tuple[Any, list[int]]:
        """(x, []) when ``x`` is a finite Python number; for a one-element ``full`` array
        (how ``2.0 * t`` traces) its number and, when the call at ``reader`` alone reads
        it, the ``full`` call's position; else (None, [])."""
        if type(x) is not Ref:
            return (x if _is_number(x) else None), []
        v = self.values[x.value]
        p = full_call(self.graph, self.values, self.position, x)
        node = None if p is None else self.graph.nodes[p]
        if node is None or not _is_number(node.args[1]) or not is_floating(v.dtype):
            return None, []
        number = v.dtype.type(node.args[1]).item()  # the array holds it rounded to its dtype
        return number, [] if self.producer(x.value, reader, views=True) is None else [p]

    def scaling(self, position: int) -> tuple[float | None, int, list[int]]:
        """(factor, operand, positions of the calls making the factor) when the call at
        ``position`` multiplies an array by a finite number or divides it by a non-zero
        one, keeping its shape, strides and dtype; else (None, -1, [])."""
        node = self.graph.nodes[position]
        if node.op != "binary" or node.kwargs or len(node.args) != 3 or node.args[0] not in ("mul", "div"):
            return None, -1, []
        op, a, b = node.args
        if op == "mul" and self.number(a, position)[0] is not None:
            a, b = b, a
        number, made = self.number(b, position)
        if type(a) is not Ref or number is None:
            return None, -1, []
        x, out = self.values[a.value], self.values[node.out.value]
        if (x.shape, x.strides, x.dtype) != (out.shape, out.strides, out.dtype) or (op == "div" and float(number) == 0.0):
            return None, -1, []
        return (float(number) if op == "mul" else 1.0 / float(number)), a.value, made

    def peel_scales(self, v: int, reader: int, positions: list[int]) -> tuple[int, float, int]:
        """(the value under the private scalings of ``v`` by numbers, the product of
        their factors, the position of the call reading that value); the calls peeled
        off are appended to ``positions``.  A view of a
        scaled array becomes the same view of the array scaled (an elementwise call
        keeps every element where it was)."""
        scale = 1.0
        while (p := self.producer(v, reader, views=True)) is not None:
            factor, operand, made = self.scaling(p)
            if factor is None:
                break
            out, w = self.values[self.graph.nodes[p].out.value], self.values[v]
            if v != out.index:
                x = self.values[operand]
                operand = self.view(x.storage, x.offset + w.offset - out.offset, w.shape, w.strides, w.dtype)
            positions += [p, *made]
            scale *= factor
            v, reader = operand, p
        return v, scale, reader

    def readable(self, operands: list[int], positions: list[int]) -> bool:
        """Whether a call at the last of ``positions`` (sorted) may read ``operands`` in
        place of the chain at ``positions``: none of them is a result of the chain, and
        no call in between writes their memory."""
        values, nodes = self.values, self.graph.nodes
        made = {values[r.value].storage for p in positions for r in (nodes[p].out,) if type(r) is Ref}
        if made & {values[i].storage for i in operands}:
            return False
        return self.uses.unwritten({values[i].storage for i in operands}, positions[0], positions[-1])
