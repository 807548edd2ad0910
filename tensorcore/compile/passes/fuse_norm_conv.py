"""Norm-into-conv fusion: a GroupNorm whose result only a convolution reads runs inside it.

``y, mean, rstd = group_norm(x, weight, bias, groups, eps, act, shift)`` followed by
``conv2d(y, w, ...)``, where the conv is the only reader of y (no other call, no view,
not a returned value; ``uses.Uses``) and nothing reads mean or rstd, becomes
``group_norm_conv2d(x, (weight, bias, groups, eps, act, shift), w, ...)`` with the
conv's epilogue keywords.  A backend may then normalize x while the convolution reads
it, and the normalized tensor is never written (cupy/conv_norm.py); the others run the
two calls.  This is a ResBlock's ``conv(silu(norm(h)))`` after ``fuse_norm`` has given
the GroupNorm its activation and time-embedding shift.

In a training graph the backward reads the statistics and y, so the pass leaves it.  The
fused call takes the conv's place, so the GroupNorm's operands must not be written in
between.
"""

from __future__ import annotations

from ..graph import Graph, Node, Ref, node_refs
from .fuse_norm import group_norm_params
from .uses import Uses, conv_of_input, rewritten

_NORM = ("weight", "bias", "groups", "eps", "act", "shift")


def fuse_norm_conv(graph: Graph) -> Graph:
    values = graph.values
    uses = Uses.of(graph, values)
    norms: dict[int, tuple[int, Node, dict]] = {}  # y value -> (position, call, its arguments)
    placed: dict[int, Node | None] = {}
    folded = 0
    for position, node in enumerate(graph.nodes):
        if node.writes or node.effect:
            continue
        if node.op == "group_norm":
            params = group_norm_params(node)
            if params is not None and _only_y_read(node, uses, values):
                norms[node.out[0].value] = (position, node, params)
        elif (conv := conv_of_input(node, position, uses, values, norms)) is not None:
            x, geometry, epilogue = conv
            norm_position, norm, params = norms.pop(x.value)
            reads = {values[r.value].storage for r in node_refs(norm)}
            if not uses.unwritten(reads, norm_position, position):
                continue
            args = (params["x"], tuple(params[name] for name in _NORM), *geometry)
            placed[norm_position] = None
            placed[position] = Node(node.index, "group_norm_conv2d", args, epilogue, node.out)
            folded += 1
    if not folded:
        return graph
    return rewritten(graph, placed, "fuse_norm_conv", folded)


def _only_y_read(node: Node, uses: Uses, values: list) -> bool:
    """Whether the call returns (y, mean, rstd) as three arrays and no call reads, and
    no output returns, the statistics."""
    out = node.out
    if type(out) is not tuple or len(out) != 3 or any(type(r) is not Ref for r in out):
        return False
    for r in out[1:]:
        storage = values[r.value].storage
        if storage in uses.returned or uses.readers.get(storage):
            return False
    return True
