"""Lowering: a Graph becomes a Plan -- which calls run once, which run on every call, and
where every storage lives (the static memory plan).

* **init** calls compute constants: no effect, no in-place write, only constant
  arguments, results nobody writes later (``tc.ones`` seeds, captured host data, ops
  on them).  They run once when the plan is bound.
* **steps** are the calls replayed on every call, in trace order.  Calls that only
  make views of existing memory are neither: every view is fixed by its storage's
  address and its geometry, so it is built once when the plan is bound.
* **placement**: inputs and constants get their own blocks; external storages stay
  where the program keeps them; every storage a step allocates is an *intermediate*
  and shares the arena with the others by lifetime -- two intermediates overlap in
  memory only if no step needs both.  Lifetimes are closed intervals of step
  positions (a step's result never shares memory with its own arguments); a storage
  that holds an output lives to the end.  Offsets come from a greedy best fit,
  largest first (first fit).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import Any, Callable

from .graph import Graph, Node, Obj, Ref, leaves, node_refs, refs, substitute

ALIGN = {"cpu": 64, "cuda": 256}  # bytes; 64 keeps SIMD loads aligned, 256 suits CUDA


@dataclass(eq=False)
class Plan:
    """A lowered graph: ``init`` and ``steps`` are node positions in ``graph.nodes``;
    ``placement[s]`` is ("input" | "const" | "arena", byte offset) for storages in the
    plan's memory (``fixed_bytes`` of inputs and constants, then ``arena_bytes`` of
    shared intermediates) and ("external", 0) for the program's own memory."""

    graph: Graph
    init: list[int]
    steps: list[int]
    placement: dict[int, tuple[str, int]]
    fixed_bytes: int
    arena_bytes: int
    intermediate_bytes: int
    writeback: list[int] = field(default_factory=list)  # inputs written in place

    @property
    def align(self) -> int:
        """The alignment, in bytes, of the plan's memory and of every placement in it."""
        return ALIGN[self.graph.device]

    def made_results(self, node: Node) -> list[tuple[tuple[int, ...], int]]:
        """(path into ``node``'s result, value index) of each result the call allocated
        (an executor binds those to their planned memory)."""
        made = made_by(self.graph, node)
        pairs: list[tuple[tuple[int, ...], int]] = []

        def walk(template: Any, path: tuple[int, ...]) -> None:
            if isinstance(template, Ref):
                if self.graph.values[template.value].storage in made:
                    pairs.append((path, template.value))
            elif isinstance(template, tuple):
                for i, item in enumerate(template):
                    walk(item, path + (i,))

        walk(node.out, ())
        return pairs

    def call_arguments(self, node: Node, value: Callable[[int], Any], obj: Callable[[int], Any]) -> tuple[tuple, dict]:
        """``node``'s (args, kwargs) with each value reference replaced by ``value(index)``
        and each object reference by ``obj(index)``: the call an executor binds."""
        return (substitute(node.args, lambda r: value(r.value), lambda o: obj(o.index)),
                substitute(node.kwargs, lambda r: value(r.value), lambda o: obj(o.index)))

    def storages_ending(self) -> dict[int, list[int]]:
        """The intermediates whose lifetime ends at each step position (an index into
        ``steps``): after that step no later one touches them, so an executor that
        allocates as it goes may free them (outputs live to the end and never appear)."""
        const = set().union(*(made_by(self.graph, self.graph.nodes[i]) for i in self.init))
        ending: dict[int, list[int]] = {}
        for s, (_, last) in _lifetimes(self.graph, self.steps, const).items():
            if last < len(self.steps):
                ending.setdefault(last, []).append(s)
        return ending

    def info(self) -> dict:
        """Sizes for ``cache_info``/``plan_info``: the arena against the intermediates;
        ``fused``: the replayed calls that are fused elementwise kernels; ``passes``:
        what the graph passes did (of a traced plan; empty for one loaded from disk)."""
        nodes = self.graph.nodes
        return {"steps": len(self.steps), "init": len(self.init), "arena_bytes": self.arena_bytes,
                "intermediate_bytes": self.intermediate_bytes, "fixed_bytes": self.fixed_bytes,
                "inputs": len(self.graph.inputs), "outputs": len(self.graph.output_refs()),
                "fused": sum(nodes[i].op == "fused_elementwise" for i in self.steps),
                "passes": dict(self.graph.stats)}


def made_by(graph: Graph, node: Node) -> set[int]:
    """The storages ``node`` allocated."""
    storage_of = graph.values
    return {storage_of[r.value].storage for r in refs(node.out)
            if graph.storages[storage_of[r.value].storage].producer == node.index}


def lower(graph: Graph) -> Plan:
    """Split the calls into init and steps and place every storage."""
    const: set[int] = set()
    init, steps = [], []
    for position, node in enumerate(graph.nodes):
        made = made_by(graph, node)
        reads = {graph.values[r.value].storage for r in node_refs(node)}
        constant = (not node.effect and not node.writes and reads <= const
                    and not any(isinstance(x, Obj) for x in leaves((node.args, node.kwargs)))
                    and not any(graph.storages[s].written for s in made))
        if constant:
            const |= made
            init.append(position)
        elif made or node.writes or node.effect:
            steps.append(position)
    placement: dict[int, tuple[str, int]] = {}
    align = ALIGN.get(graph.device, 256)
    fixed = 0
    for s in graph.storages:
        if s.kind == "input" or s.index in const:
            placement[s.index] = ("input" if s.kind == "input" else "const", fixed)
            fixed = _round_up(fixed + s.nbytes, align)
        elif s.kind == "external":
            placement[s.index] = ("external", 0)
    lifetimes = _lifetimes(graph, steps, const)
    offsets, arena = _place(lifetimes, {s: graph.storages[s].nbytes for s in lifetimes}, align)
    for s, offset in offsets.items():
        placement[s] = ("arena", offset)
    writeback = sorted(s.input_index for s in graph.storages if s.kind == "input" and s.written)
    return Plan(graph, init, steps, placement, fixed, arena,
                sum(graph.storages[s].nbytes for s in lifetimes), writeback)


def _lifetimes(graph: Graph, steps: list[int], const: set[int]) -> dict[int, tuple[int, int]]:
    """[first, last] step position of every intermediate (outputs live to the end)."""
    span: dict[int, list[int]] = {}
    for position, index in enumerate(steps):
        node = graph.nodes[index]
        touched = {graph.values[r.value].storage for r in (*node_refs(node), *refs(node.out))}
        for s in touched | set(node.writes):
            if graph.storages[s].kind in ("fresh", "data") and s not in const:
                entry = span.setdefault(s, [position, position])
                entry[1] = position
    end = len(steps)
    for r in graph.output_refs():
        s = graph.values[r.value].storage
        if s in span:
            span[s][1] = end
    return {s: (a, b) for s, (a, b) in span.items()}


def _place(lifetimes: dict[int, tuple[int, int]], sizes: dict[int, int], align: int) -> tuple[dict[int, int], int]:
    """Greedy by size: largest first, each at the lowest aligned offset where it
    overlaps no placed block whose lifetime overlaps its own."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    offsets: dict[int, int] = {}
    for s in sorted(lifetimes, key=lambda s: (-sizes[s], lifetimes[s])):
        first, last = lifetimes[s]
        size = _round_up(max(sizes[s], 1), align)
        busy = sorted((o, o + n) for o, n, a, b in placed if a <= last and first <= b)
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        offsets[s] = offset
        placed.append((offset, size, first, last))
    return offsets, max((o + n for o, n, _, _ in placed), default=0)


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align
