"""Gate-bias fusion: a projection's bias is added by the gate that reads it.

``y = matmul_bias_act(a, b, bias, "none")`` followed by ``gated_activation(y, act)``,
where the gate is the only reader of y (no other call, no view, not a returned value;
``uses.Uses``), becomes ``y = matmul(a, b)`` and ``gated_activation(y, act, bias=bias)``:
GEGLU's projection, whose output is eight times the width of the block's tokens, is then
written once by the product and read once by the gate, with no pass of its own for the
bias.  The backends round ``y + bias`` to y's dtype before the gate, as the separate add
stores it, so the result is the unfused one's.

The gate reads the bias later than the product did, so nothing in between may write it.
In a training graph the backward reads y, so the pass leaves it.
"""

from __future__ import annotations

from ..graph import Graph, Node, Ref
from .uses import Uses, rewritten


def fuse_gate_bias(graph: Graph) -> Graph:
    values = graph.values
    uses = Uses.of(graph, values)
    products: dict[int, tuple[int, Node]] = {}  # y value -> (position, matmul_bias_act call)
    placed: dict[int, Node | None] = {}
    folded = 0
    for position, node in enumerate(graph.nodes):
        if node.writes or node.effect or type(node.out) is not Ref:
            continue
        if node.op == "matmul_bias_act" and len(node.args) == 4 and not node.kwargs \
                and type(node.args[2]) is Ref and node.args[3] == "none":
            products[node.out.value] = (position, node)
        elif node.op == "gated_activation" and len(node.args) == 2 and not node.kwargs \
                and type(node.args[0]) is Ref and node.args[0].value in products:
            y = node.args[0].value
            first, product = products.pop(y)
            a, b, bias, _ = product.args
            if not uses.only_reader(values, y, node, position) \
                    or not uses.unwritten({values[bias.value].storage}, first, position):
                continue
            placed[first] = Node(product.index, "matmul", (a, b), {}, product.out)
            placed[position] = Node(node.index, "gated_activation", node.args, {"bias": bias}, node.out)
            folded += 1
    if not folded:
        return graph
    return rewritten(graph, placed, "fuse_gate_bias", folded)
