"""Norm fusion: the calls around a GroupNorm that its kernel can do on the way.

* **shift**: ``s = binary('add', x, shift)`` (either order) read only by
  ``group_norm(s, ...)``, where ``shift`` broadcasts to x [N, C, *] with one value per
  sample and channel (shape [N, C, 1, 1], [1, C, 1, 1], [C, 1, 1], [N, C], ...: every
  axis after the channel of size 1) -> ``group_norm(x, ..., shift=shift2d)``, shift2d
  the same memory viewed as [N, C].  The kernels add it to x as they read it, rounded
  as the add would store it, so the statistics and results are the eager ones.  This is
  a ResBlock's time-embedding add.  In a training graph the backward reads the sum, so
  the pass leaves it.
* **activation**: ``group_norm(..., act='none')`` whose normalised result only
  ``unary(act, y)`` reads, for an activation of ``ACTIVATIONS`` -> ``act=``.

"Only reads" is ``uses.Uses.only_reader``: no other call, no other view, not a returned
value.  The fused call stays at the GroupNorm's place, so the add's operands must not
be written between the add and the GroupNorm; the activation's result is then made at
that place too.
"""

from __future__ import annotations

import dataclasses
import inspect

from ...backends.base import Backend
from ..graph import Graph, Node, Ref, Value
from .uses import ACTS, Uses, Views, call_arguments, fresh_block, rewritten

_GROUP_NORM = inspect.signature(Backend.group_norm)


def fuse_norm(graph: Graph) -> Graph:
    views = Views(graph.values)
    values = views.values
    uses = Uses.of(graph, values)
    storages = list(graph.storages)
    sums: dict[int, tuple[int, Node]] = {}  # result value of an add -> (position, call)
    norms: dict[int, tuple[int, Node]] = {}  # result of a group_norm without act -> (position, call)
    placed: dict[int, Node | None] = {}  # position -> its new call (None: folded away)
    folded = 0
    for position, node in enumerate(graph.nodes):
        if node.writes or node.effect:
            continue
        if node.op == "binary" and len(node.args) == 3 and node.args[0] == "add" and not node.kwargs \
                and type(node.out) is Ref and fresh_block(graph, node, values[node.out.value]):
            sums[node.out.value] = (position, node)
        elif node.op == "group_norm":
            params = group_norm_params(node)
            if params is None:
                continue
            x = params["x"]
            if type(x) is Ref and x.value in sums and params["shift"] is None \
                    and uses.only_reader(values, x.value, node, position):
                add_position, add = sums[x.value]
                shifted = _shift(add, values, views)
                if shifted is not None and uses.unwritten({values[r.value].storage for r in shifted},
                                                          add_position, position):
                    params["x"], params["shift"] = shifted
                    node = placed[position] = _group_norm(node, params, node.out)
                    placed[add_position] = None
                    folded += 1
            if params["act"] == "none" and type(node.out) is tuple and type(node.out[0]) is Ref:
                norms[node.out[0].value] = (position, node)
        elif node.op == "unary" and len(node.args) == 2 and node.args[0] in ACTS and not node.kwargs \
                and type(node.args[1]) is Ref and node.args[1].value in norms and type(node.out) is Ref:
            y, out = node.args[1].value, values[node.out.value]
            if not (uses.only_reader(values, y, node, position) and fresh_block(graph, node, out)
                    and out.shape == values[y].shape):
                continue
            norm_position, norm = norms.pop(y)
            params = group_norm_params(norm)
            params["act"] = node.args[0]
            placed[norm_position] = _group_norm(norm, params, (node.out, *norm.out[1:]))
            placed[position] = None
            storages[out.storage] = dataclasses.replace(storages[out.storage], producer=norm.index)
            folded += 1
    if not folded:
        return graph
    return rewritten(graph, placed, "fuse_norm", folded, values=values, storages=storages)


def group_norm_params(node: Node) -> dict | None:
    """A group_norm call's arguments by name (defaults filled in), or None when they do
    not bind to the protocol's signature."""
    return call_arguments(_GROUP_NORM, node, defaults=True)


def _group_norm(node: Node, params: dict, out: tuple) -> Node:
    """The group_norm call of ``params`` in place of ``node``: the positional arguments,
    then ``act`` and ``shift`` as keywords when they are not the defaults."""
    args = tuple(params[name] for name in ("x", "weight", "bias", "groups", "eps"))
    kwargs = {name: params[name] for name, default in (("act", "none"), ("shift", None)) if params[name] != default}
    return Node(node.index, "group_norm", args, kwargs, out)


def _shift(add: Node, values: list[Value], views: Views) -> tuple[Ref, Ref] | None:
    """(x, shift viewed as [N, C]) of ``binary('add', x, shift)`` (either order), or None
    when neither operand is x with the other one value per sample and channel."""
    out = values[add.out.value]
    for x, s in (add.args[1:], add.args[:0:-1]):
        if type(x) is not Ref or type(s) is not Ref or x == s:
            continue
        xv, sv = values[x.value], values[s.value]
        if xv.shape != out.shape or xv.dtype != out.dtype or sv.dtype != out.dtype or len(out.shape) < 2 \
                or len(sv.shape) > len(out.shape):
            continue
        pad = len(out.shape) - len(sv.shape)
        shape, strides = (1,) * pad + sv.shape, (0,) * pad + sv.strides
        n, c = out.shape[:2]
        if any(d != 1 for d in shape[2:]) or shape[0] not in (1, n) or shape[1] not in (1, c):
            continue
        along = tuple(st if size > 1 else 0 for size, st in zip(shape[:2], strides[:2]))
        return x, Ref(views.get(sv.storage, sv.offset, (n, c), along, sv.dtype))
    return None
