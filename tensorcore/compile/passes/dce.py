"""Dead-code elimination: drop calls whose results nothing observes.

A storage is *observable* when it is an input or external buffer (written in place, the
caller sees it), or holds an output.  Walking the calls backwards, a call is kept when
it has an effect of its own (a random draw advances a generator) or when it produces
or writes a storage that a kept later call reads or that is observable; a kept call
makes everything it reads live.  Calls that only make views produce nothing and go.
"""

from __future__ import annotations

import dataclasses

from ..graph import Graph, node_refs, refs


def dead_code_elimination(graph: Graph) -> Graph:
    storage_of = [v.storage for v in graph.values]
    live = {s.index for s in graph.storages if s.kind in ("input", "external")}
    live |= {storage_of[r.value] for r in graph.output_refs()}
    kept = []
    for node in reversed(graph.nodes):
        made = {storage_of[r.value] for r in refs(node.out)
                if graph.storages[storage_of[r.value]].producer == node.index}
        if node.effect or (made | set(node.writes)) & live:
            kept.append(node)
            live |= {storage_of[r.value] for r in node_refs(node)}
    kept.reverse()
    return dataclasses.replace(graph, nodes=kept)
