"""The LoRA rewrite: ``base(x) + ((x @ A) @ B) * scale`` becomes one ``lora_linear`` call.

The pattern, as a LoRALinear's forward traces it: ``y + d`` or ``d + y`` where

* ``y`` = ``bias_act(matmul(x, weight_t), bias, "none", last axis)``, or the
  ``matmul(x, weight_t)`` alone (a Linear without bias);
* ``d`` = ``matmul(matmul(x, A), B)``, times or divided by numbers known when tracing
  (or not scaled at all; see ``chains``), the same ``x`` (same memory, same view) as
  the base product;
* ``weight_t`` [in, out] (a Linear's weight transposed: a view), ``A`` [in, rank],
  ``B`` [rank, out] and ``bias`` [out] are 2-D / 1-D, and every array has one float dtype.

Products may be read through a reshape that keeps their rows (a 1-D x is multiplied as
[1, in] and its [1, out] product read as [out]).
Every intermediate must be read by the next call alone (the rules of
``fuse_elementwise``: no other reader, no other view, not returned, a block of its
own) and no call in between may write the memory the operands live in.  So a
training graph, whose backward reads ``x @ A`` for B's gradient, keeps its calls, and
a merged LoRALinear (whose forward is the base alone) has nothing to rewrite.  The
chain becomes ``lora_linear(x, weight_t, bias, A, B, scale)`` at the place of the
add.  The fused kernels sum the rank products in their own order, so results match
eager within float rounding, not bit for bit (the NumPy reference is exact).
"""

from __future__ import annotations

import dataclasses
import math

from ..graph import Graph, Node, Ref, Value
from .chains import DTYPES, Chains, is_call
from .uses import c_strides, owns_block, rewritten


def lora(graph: Graph) -> Graph:
    chains = Chains(graph)
    values = chains.values
    placed: dict[int, Node | None] = {}  # None: a call of a rewritten chain, dropped
    storages = list(graph.storages)
    count = 0
    for position, node in enumerate(graph.nodes):
        found = _match(chains, position)
        if found is None or any(p in placed for p in found[0]):
            continue
        positions, args = found
        placed.update(dict.fromkeys(positions))
        # the result: the add's block, shaped as lora_linear returns it (x's rows, out)
        out, x = values[node.out.value], values[args[0].value]
        shape = x.shape[:-1] + out.shape[-1:]
        strides = c_strides(shape, out.dtype.itemsize)
        result = chains.view(out.storage, 0, shape, strides, out.dtype)
        storages[out.storage] = dataclasses.replace(storages[out.storage], root=(shape, strides, out.dtype))
        placed[position] = Node(node.index, "lora_linear", args, {}, Ref(result))
        count += 1
    if not count:
        return graph
    return rewritten(graph, placed, "lora", count, storages=storages, values=values)


def _match(chains: Chains, position: int) -> tuple[list[int], tuple] | None:
    """(positions of the chain's calls, the ``lora_linear`` arguments) of the pattern
    ending with the add at ``position``, or None."""
    node = chains.graph.nodes[position]
    if node.op != "binary" or node.kwargs or len(node.args) != 3 or node.args[0] != "add":
        return None
    _, a, b = node.args
    if type(a) is not Ref or type(b) is not Ref:
        return None
    for base, delta in ((a.value, b.value), (b.value, a.value)):
        found = _base(chains, base, position), _delta(chains, delta, position)
        if None in found:
            continue
        (base_calls, x, weight_t, bias), (delta_calls, x2, lora_a, lora_b, scale) = found
        args = (Ref(x), Ref(weight_t), None if bias is None else Ref(bias), Ref(lora_a), Ref(lora_b), scale)
        inputs = [x, weight_t, lora_a, lora_b] + ([] if bias is None else [bias])
        positions = sorted([position, *base_calls, *delta_calls])
        if _same_view(chains.values, x, x2) and _fits(chains, inputs, node) and chains.readable(inputs, positions):
            return positions, args
    return None


def _rows(chains: Chains, v: int, reader: int) -> int | None:
    """The position of the call making ``v`` when ``v`` is a private intermediate of the
    call at ``reader``: its result, or a reshape of it that keeps its rows (how a 1-D
    input's [1, n] product is read as [n])."""
    p = chains.producer(v, reader, views=True)
    if p is None:
        return None
    w, out = chains.values[v], chains.values[chains.graph.nodes[p].out.value]
    if w.index == out.index or (w.offset == 0 and w.shape[-1:] == out.shape[-1:] and w.nbytes == out.nbytes
                                and w.strides == c_strides(w.shape, w.dtype.itemsize)):
        return p
    return None


def _base(chains: Chains, y: int, reader: int) -> tuple[list[int], int, int, int | None] | None:
    """(calls, x, weight_t, bias) when ``y`` is ``x @ weight_t`` with or without a bias
    added along the last axis."""
    nodes, values = chains.graph.nodes, chains.values
    p = _rows(chains, y, reader)
    if p is None:
        return None
    calls, bias = [p], None
    node = nodes[p]
    if node.op == "bias_act" and not node.kwargs and len(node.args) == 4:
        product, bias, act, axis = node.args
        if type(product) is not Ref or type(bias) is not Ref or act != "none" or type(axis) is not int:
            return None
        rank = len(values[product.value].shape)
        p = _rows(chains, product.value, p) if -rank <= axis < rank and axis % rank == rank - 1 else None
        if p is None:
            return None
        calls.append(p)
        bias = bias.value
    if not is_call(nodes[p], "matmul", 2):
        return None
    return calls, nodes[p].args[0].value, nodes[p].args[1].value, bias


def _delta(chains: Chains, d: int, reader: int) -> tuple[list[int], int, int, int, float] | None:
    """(calls, x, A, B, scale) when ``d`` is ``(x @ A) @ B`` scaled by numbers."""
    nodes = chains.graph.nodes
    calls: list[int] = []
    d, scale, reader = chains.peel_scales(d, reader, calls)
    p = _rows(chains, d, reader)
    if p is None or not is_call(nodes[p], "matmul", 2):
        return None
    xa, lora_b = nodes[p].args[0].value, nodes[p].args[1].value
    q = _rows(chains, xa, p)
    if q is None or not is_call(nodes[q], "matmul", 2):
        return None
    return calls + [p, q], nodes[q].args[0].value, nodes[q].args[1].value, lora_b, scale


def _same_view(values: list[Value], a: int, b: int) -> bool:
    va, vb = values[a], values[b]
    return (va.storage, va.offset, va.shape, va.strides, va.dtype) == (vb.storage, vb.offset, vb.shape, vb.strides, vb.dtype)


def _fits(chains: Chains, inputs: list[int], add: Node) -> bool:
    """Whether the operands have the shapes of a Linear with a rank-r update, the add's
    result holds x's rows (nothing broadcast), and all share one float dtype."""
    values = chains.values
    x, weight_t, lora_a, lora_b, *bias = (values[i] for i in inputs)
    out = values[add.out.value]
    if len(x.shape) < 1 or not len(weight_t.shape) == len(lora_a.shape) == len(lora_b.shape) == 2:
        return False
    (k, n), r = weight_t.shape, lora_a.shape[1]
    shapes = (x.shape[-1] == k and lora_a.shape[0] == k and lora_b.shape == (r, n) and out.shape[-1:] == (n,)
              and math.prod(out.shape) == math.prod(x.shape[:-1]) * n and all(v.shape == (n,) for v in bias))
    dtypes = {v.dtype for v in (x, weight_t, lora_a, lora_b, out, *bias)}
    return shapes and len(dtypes) == 1 and dtypes.pop().name in DTYPES and owns_block(chains.graph, add, values)
