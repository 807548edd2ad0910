"""The traced program as plain data: storages, values, nodes.

A traced call is a flat list of backend calls (``Node``).  Every array a call reads or
writes is a ``Value``: a view (byte offset, shape, strides, dtype) of a ``Storage``, the
memory block it lives in.  Storages are the unit of the memory plan and of binding:

* ``input``     a plan-owned buffer the caller's tensor is copied into on every call;
* ``external``  memory that existed before the call (parameters, buffers, optimizer
  state, device scalars), bound by reference so its values may change between calls;
* ``fresh``     memory a call allocated during the trace (intermediates);
* ``data``      host data captured by value while tracing (``tc.tensor(...)`` in the
  traced function); it is a constant of the plan.

Arguments of a node are a *template*: the call's arguments with every array replaced by
``Ref(value)`` and every opaque object (a random generator) by ``Obj(index)``; the
rest (op names, shapes, scalars, dtypes, slices) is kept as it was.  ``Graph.table()``
prints the program one call per line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np


@dataclass(frozen=True, slots=True)
class Ref:
    """An array argument or result: the index of its Value."""

    value: int


@dataclass(frozen=True, slots=True)
class Obj:
    """An opaque object argument bound by reference (a random generator's state)."""

    index: int


@dataclass(eq=False)
class Storage:
    """A block of memory: ``nbytes`` from its lowest byte; ``origin`` is the offset of the
    root array's first element in the block, ``root`` its (shape, strides, dtype)."""

    index: int
    kind: str  # "input" | "external" | "fresh" | "data"
    nbytes: int
    origin: int = 0
    root: tuple = ()
    input_index: int | None = None
    name: str | None = None  # external: a stable name ("model.fc.weight") for the disk cache
    producer: int | None = None  # fresh / data: the node that made it
    written: bool = False  # some node writes into it in place


@dataclass(frozen=True, eq=False)
class Value:
    """An array: a view of storage ``storage`` starting ``offset`` bytes into it."""

    index: int
    storage: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(eq=False)
class Node:
    """One backend call: ``op(*args, **kwargs) -> out`` (templates, see the module doc).

    ``writes`` lists the storages the call writes into in place; ``effect`` marks calls
    whose effect is not visible in their arrays (random draws advance a generator)."""

    index: int
    op: str
    args: tuple
    kwargs: dict
    out: Any
    writes: tuple[int, ...] = ()
    effect: bool = False
    data: Any = None  # op "constant": the captured backend array


@dataclass(eq=False)
class Graph:
    """A traced call: storages, values, nodes, and where inputs and outputs are."""

    backend: str
    device: str
    storages: list[Storage] = field(default_factory=list)
    values: list[Value] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    objects: list[Any] = field(default_factory=list)
    object_names: list[str | None] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)  # value of each input tensor
    outputs: Any = None  # the returned structure, Tensors replaced by Ref
    effects: list[Callable[[], None]] = field(default_factory=list)  # host effects to repeat
    guards: list[Callable[[], bool]] = field(default_factory=list)  # host decisions to re-check
    stats: dict[str, int] = field(default_factory=dict)  # what the passes did ("cse": calls merged)

    def storage_of(self, ref: Ref) -> Storage:
        return self.storages[self.values[ref.value].storage]

    def output_refs(self) -> list[Ref]:
        return list(refs(self.outputs))

    def table(self) -> str:
        """The program as a table, one node per line (as ``torch.fx``'s print_tabular)."""
        lines = [f"graph on {self.backend} ({self.device}): {len(self.nodes)} nodes, "
                 f"{len(self.storages)} storages"]
        for s in self.storages:
            if s.kind != "fresh":
                where = s.name or (f"input {s.input_index}" if s.kind == "input" else "")
                lines.append(f"  s{s.index:<4} {s.kind:<9} {s.nbytes:>10} B  {where}")
        for node in self.nodes:
            out = _render(node.out, self)
            call = ", ".join([_render(a, self) for a in node.args]
                             + [f"{k}={_render(v, self)}" for k, v in node.kwargs.items()])
            tags = (" writes " + ",".join(f"s{s}" for s in node.writes)) if node.writes else ""
            lines.append(f"  {out} = {node.op}({call}){tags}{' [effect]' if node.effect else ''}")
        lines.append(f"  return {_render(self.outputs, self)}")
        return "\n".join(lines)

    __str__ = table


def tree_map(tree: Any, fn: Callable[[Any], Any]) -> Any:
    """``tree`` with ``fn`` applied to every item that is not a tuple, list or dict (the
    containers are rebuilt as they were)."""
    kind = type(tree)
    if kind is tuple or kind is list:
        return kind([tree_map(item, fn) for item in tree])
    if kind is dict:
        return {k: tree_map(v, fn) for k, v in tree.items()}
    return fn(tree)


def leaves(tree: Any) -> Iterator[Any]:
    """Every item of ``tree`` that is not a tuple, list or dict, in order."""
    kind = type(tree)
    if kind is tuple or kind is list:
        for item in tree:
            yield from leaves(item)
    elif kind is dict:
        for item in tree.values():
            yield from leaves(item)
    else:
        yield tree


def refs(template: Any) -> Iterator[Ref]:
    """Every Ref inside a template."""
    return (x for x in leaves(template) if type(x) is Ref)


def substitute(template: Any, ref: Callable[[Ref], Any], obj: Callable[[Obj], Any]) -> Any:
    """The template with every Ref and Obj replaced."""
    return tree_map(template, lambda x: ref(x) if type(x) is Ref else obj(x) if type(x) is Obj else x)


def node_refs(node: Node) -> Iterator[Ref]:
    """Every array argument of ``node``."""
    yield from refs(node.args)
    yield from refs(node.kwargs)


def _render(template: Any, graph: Graph) -> str:
    kind = type(template)
    if kind is Ref:
        v = graph.values[template.value]
        return f"%{v.index}:{v.dtype.name}{list(v.shape)}@s{v.storage}"
    if kind is Obj:
        return f"<{graph.object_names[template.index] or type(graph.objects[template.index]).__name__}>"
    if kind is tuple:
        return "(" + ", ".join(_render(t, graph) for t in template) + ("," if len(template) == 1 else "") + ")"
    if kind is list:
        return "[" + ", ".join(_render(t, graph) for t in template) + "]"
    if kind is dict:
        return "{" + ", ".join(f"{k!r}: {_render(v, graph)}" for k, v in template.items()) + "}"
    return repr(template)
