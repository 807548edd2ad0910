"""Common-subexpression elimination: a pure call repeated on the same arguments runs once.

Two calls collapse when they are the same backend method with the same arguments:
the same array values (same storage and view geometry) and equal static arguments
(compared with their types, so ``1`` and ``1.0`` differ).  Only pure calls take part:
no random draw or other effect, no in-place write, no opaque object, no captured
constant, every result a block the call allocated that nothing writes later; and the
storages the first call read must not be written before the second.  The second
call's results are then the first call's: every value viewing them is re-pointed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..graph import Graph, Node, Obj, Ref, Value, leaves, node_refs, refs, tree_map
from ..plan import made_by


def common_subexpression_elimination(graph: Graph) -> Graph:
    values = list(graph.values)
    by_key = {(v.storage, v.offset, v.shape, v.strides, v.dtype): v.index for v in values}
    value_map: dict[int, int] = {}  # value of a dropped call's result -> the first call's
    storage_map: dict[int, int] = {}
    seen: dict[Any, tuple[int, Node]] = {}
    last_write: dict[int, int] = {}
    kept: list[Node] = []

    def remap(v: int) -> int:
        if v in value_map:
            return value_map[v]
        old = values[v]
        if old.storage not in storage_map:
            return v
        key = (storage_map[old.storage], old.offset, old.shape, old.strides, old.dtype)
        if key not in by_key:
            by_key[key] = len(values)
            values.append(Value(len(values), *key))
        value_map[v] = by_key[key]
        return value_map[v]

    def rewrite(template: Any) -> Any:
        return tree_map(template, lambda x: Ref(remap(x.value)) if type(x) is Ref else x)

    for position, node in enumerate(graph.nodes):
        if value_map or storage_map:
            node = dataclasses.replace(node, args=rewrite(node.args), kwargs=rewrite(node.kwargs))
        key = _key(graph, node)
        if key is not None and key in seen:
            first_position, first = seen[key]
            reads = {values[r.value].storage for r in node_refs(node)}
            pairs = _pair_results(graph, first, node)
            if pairs is not None and all(last_write.get(s, -1) < first_position for s in reads):
                storage_map.update(pairs)
                continue
        if key is not None:
            seen[key] = (position, node)
        for s in node.writes:
            last_write[s] = position
        kept.append(node)
    if not storage_map:
        return graph
    return dataclasses.replace(graph, values=values, nodes=kept, outputs=rewrite(graph.outputs),
                               stats={**graph.stats, "cse": graph.stats.get("cse", 0) + len(graph.nodes) - len(kept)})


def _key(graph: Graph, node: Node) -> Any:
    """A hashable form of a pure call, or None for calls that must not be merged."""
    if node.effect or node.writes or node.op == "constant" or "out" in node.kwargs:
        return None
    if any(type(x) is Obj for x in leaves((node.args, node.kwargs))):
        return None
    outs = list(refs(node.out))
    made = made_by(graph, node)
    if not outs or len(made) != len(outs) or any(graph.storages[s].written for s in made):
        return None
    try:
        return (node.op, _canonical(node.args), _canonical(sorted(node.kwargs.items())))
    except TypeError:  # an unhashable static argument
        return None


def _canonical(template: Any) -> Any:
    """The template with every leaf tagged by its type (``1 != 1.0 != True`` here)."""
    kind = type(template)
    if kind is tuple or kind is list:
        return (kind.__name__, tuple(_canonical(x) for x in template))
    if kind is dict:
        return ("dict", tuple((k, _canonical(v)) for k, v in template.items()))
    if kind is float or isinstance(template, np.floating):
        return (kind.__name__, repr(template))  # NaN equals itself, -0.0 differs from 0.0
    if kind is slice:
        return ("slice", _canonical((template.start, template.stop, template.step)))
    if kind is np.ndarray:
        return ("ndarray", template.dtype.str, template.shape, template.tobytes())
    hash(template)
    return (kind.__name__, template)


def _pair_results(graph: Graph, first: Node, second: Node) -> dict[int, int] | None:
    """second's result storage -> first's, when their results are laid out alike."""
    a, b = list(refs(first.out)), list(refs(second.out))
    if len(a) != len(b):
        return None
    pairs = {}
    for ra, rb in zip(a, b):
        va, vb = graph.values[ra.value], graph.values[rb.value]
        sa, sb = graph.storages[va.storage], graph.storages[vb.storage]
        if (va.offset, va.shape, va.strides, va.dtype) != (vb.offset, vb.shape, vb.strides, vb.dtype) \
                or (sa.nbytes, sa.origin, sa.root) != (sb.nbytes, sb.origin, sb.root):
            return None
        pairs[vb.storage] = va.storage
    return pairs
