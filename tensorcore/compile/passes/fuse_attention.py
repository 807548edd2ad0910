"""Attention fusion: attention written by hand becomes the backend's ``attention`` call.

The pattern, read backwards from a ``matmul(probs, v)``:

* ``probs = softmax(scores)`` (softmax over the last axis);
* ``scores`` = ``s + mask`` or ``mask + s`` (optional; an array of the scores' dtype
  that broadcasts to the scores' shape), where
* ``s`` = ``t * c``, ``c * t`` or ``t / c`` with ``c`` a number known when tracing (a
  Python number, or the one-element ``full`` array ``c * t`` makes of it), any number
  of times (also none), down to
* ``t = matmul(q, kt)``: ``kt`` [..., D, Lk] is k [..., Lk, D] transposed -- a transposed
  view of k, or k stored transposed -- and either operand may itself be scaled by
  such numbers (``(q * c) @ kt``).  A tensor scale (an input, a parameter) is not a
  number: its value may change between calls.

All of q, k, v and the scores have the same batch dims, [B, L, D] or [B, H, L, D], one
float dtype, and the scales multiply into the call's ``scale``.  Every intermediate
must be read by the next call alone (the rules of ``fuse_elementwise``: no other
reader, no other view, not returned, a block of its own) and no call in between may
write the memory q, k, v or the mask live in.  The chain becomes one
``attention(q, k, v, mask, False, scale)`` call at the place of the last matmul
(rank-3 operands are viewed as [B, 1, L, D]); its ``probs`` result takes the
softmax's memory.  In a training graph the backward reads the probabilities, so the
chain is left alone there.

The fused call computes ``(q kᵀ) * scale + mask`` in that order: on the NumPy backend
a graph that scales the product by a multiplication gives the eager result bit for
bit, one that scales q before the product, or divides, rounds differently (float32
bounds).  The Numba and CuPy backends' attention kernels sum their products in their
own order: float32 bounds there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..graph import Graph, Node, Ref, Value
from .chains import DTYPES, Chains, is_call
from .uses import c_strides, owns_block, rewritten


@dataclasses.dataclass(eq=False)
class _Match:
    positions: list[int]  # every call of the chain, the final matmul last
    q: int
    kt: int  # the product's second operand: k [..., Lk, D] is its transposed view
    v: int
    mask: int | None
    probs: int
    scale: float


def fuse_attention(graph: Graph) -> Graph:
    finder = _Finder(graph)
    matches = [m for m in (finder.match(p) for p in range(len(graph.nodes))) if m is not None]
    placed: dict[int, Node | None] = {}  # None: a call of a fused chain, dropped
    storages = list(graph.storages)
    count = 0
    for m in matches:
        if any(p in placed for p in m.positions):
            continue
        placed.update(dict.fromkeys(m.positions))
        placed[m.positions[-1]] = _fused(m, graph.nodes[m.positions[-1]], finder.values, finder.view, storages)
        count += 1
    if not count:
        return graph
    return rewritten(graph, placed, "fuse_attention", count, storages=storages, values=finder.values)


class _Finder(Chains):
    """Matches the attention pattern ending at a call."""

    def match(self, position: int) -> _Match | None:
        nodes = self.graph.nodes
        last = nodes[position]
        if not is_call(last, "matmul", 2) or not owns_block(self.graph, last, self.values):
            return None
        probs, v = last.args[0].value, last.args[1].value
        p = self.producer(probs, position)
        if p is None or not is_call(nodes[p], "softmax", 1):
            return None
        scores = nodes[p].args[0].value
        add = self.producer(scores, p)
        if add is not None and nodes[add].op == "binary" and nodes[add].args[0] == "add":
            for scores, mask in _mask_adds(nodes[add], self.values):
                found = self.chain(scores, mask, [position, p, add], probs, v, last)
                if found is not None:
                    return found
            return None
        return self.chain(scores, None, [position, p], probs, v, last)

    def chain(self, scores: int, mask: int | None, positions: list[int], probs: int, v: int,
              last: Node) -> _Match | None:
        """The match whose scores (before the mask) are ``scores``: scalings, then
        ``matmul(q, kt)`` with scalings of its own operands."""
        nodes, values = self.graph.nodes, self.values
        positions = list(positions)
        scores, scale, reader = self.peel_scales(scores, positions[-1], positions)
        p = self.producer(scores, reader)
        if p is None or not is_call(nodes[p], "matmul", 2):
            return None
        positions.append(p)
        q, q_scale, _ = self.peel_scales(nodes[p].args[0].value, p, positions)
        kt, k_scale, _ = self.peel_scales(nodes[p].args[1].value, p, positions)
        inputs = [q, kt, v] + ([] if mask is None else [mask])
        positions.sort()
        if not (_fits(values, q, kt, v, mask, probs, last.out.value) and self.readable(inputs, positions)):
            return None
        return _Match(positions, q, kt, v, mask, probs, scale * q_scale * k_scale)


def _mask_adds(node: Node, values: list[Value]) -> list[tuple[int, int]]:
    """The ways to read ``a + b`` as (scores, mask): the scores have the result's shape,
    the mask is an array of their dtype that broadcasts to it, held elsewhere."""
    if node.kwargs or len(node.args) != 3 or type(node.args[1]) is not Ref or type(node.args[2]) is not Ref:
        return []
    a, b = node.args[1].value, node.args[2].value
    out = values[node.out.value].shape
    found = []
    for scores, mask in ((a, b), (b, a)):
        s, m = values[scores], values[mask]
        if s.shape == out and len(m.shape) <= len(out) and m.dtype == s.dtype and m.storage != s.storage:
            found.append((scores, mask))
    return found


def _fits(values: list[Value], q: int, kt: int, v: int, mask: int | None, probs: int, out: int) -> bool:
    """Whether the operands have attention's shapes (one batch, no broadcasting) and
    one float dtype."""
    qv, kv, vv, pv = values[q], values[kt], values[v], values[probs]
    rank = len(qv.shape)
    if rank not in (3, 4) or not len(kv.shape) == len(vv.shape) == rank:
        return False
    lead, (lq, d), (d2, lk), (lk2, dv) = qv.shape[:-2], qv.shape[-2:], kv.shape[-2:], vv.shape[-2:]
    if kv.shape[:-2] != lead or vv.shape[:-2] != lead or d != d2 or lk != lk2 or pv.shape != lead + (lq, lk):
        return False
    dtypes = {values[i].dtype for i in (q, kt, v, probs, out)} | ({values[mask].dtype} if mask is not None else set())
    return len(dtypes) == 1 and dtypes.pop().name in DTYPES


def _fused(m: _Match, last: Node, values: list[Value], view: Any, storages: list) -> Node:
    """The ``attention`` call of a match, in place of its last matmul; the result and
    probability storages become blocks of the attention call's 4-D results."""
    def as4d(i: int) -> int:
        """[B, L, D] viewed as [B, 1, L, D] (the new axis strided as in a C-contiguous array)."""
        x = values[i]
        if len(x.shape) == 4:
            return i
        return view(x.storage, x.offset, (x.shape[0], 1) + x.shape[1:],
                    (x.strides[0], x.shape[1] * x.strides[1]) + x.strides[1:], x.dtype)

    kt = values[m.kt]
    k = view(kt.storage, kt.offset, kt.shape[:-2] + kt.shape[:-3:-1], kt.strides[:-2] + kt.strides[:-3:-1], kt.dtype)
    mask = None
    if m.mask is not None:
        mv = values[m.mask]
        rank = len(values[m.q].shape)
        pad = rank - len(mv.shape)
        shape, strides = (1,) * pad + mv.shape, (0,) * pad + mv.strides
        if rank == 3:
            shape, strides = shape[:1] + (1,) + shape[1:], strides[:1] + (0,) + strides[1:]
        mask = Ref(view(mv.storage, mv.offset, shape, strides, mv.dtype))
    results = []
    for i in (last.out.value, m.probs):
        x = values[i]
        shape = x.shape if len(x.shape) == 4 else (x.shape[0], 1) + x.shape[1:]
        strides = c_strides(shape, x.dtype.itemsize)
        results.append(Ref(view(x.storage, 0, shape, strides, x.dtype)))
        storages[x.storage] = dataclasses.replace(storages[x.storage], producer=last.index,
                                                  root=(shape, strides, x.dtype))
    args = (Ref(as4d(m.q)), Ref(as4d(k)), Ref(as4d(m.v)), mask, False, m.scale)
    return Node(last.index, "attention", args, {}, tuple(results))
