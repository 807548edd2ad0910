"""Elementwise fusion: a chain of elementwise calls becomes one generated kernel.

Fusable calls: ``unary``, ``binary``, ``where`` and ``bias_act`` (a bias add along an
axis, then an activation) on float32 / float64 / bool arrays, Python scalars becoming
constants in the dtype NumPy would use, and only the ops the backend's fused kernels
compute bit for bit as its eager calls (``fused_unary`` / ``fused_binary`` of the
backend; the Numba backend leaves out the libm functions); each call's result is a C-contiguous block of
its own (its result is C-contiguous and fills its block).  A call joins the group of the call that produced one of its operands when
that result has the same shape as its own (inputs broadcast; the group has one output
shape) and nothing else reads it -- no other call, no view, not the returned value --
and no call in between writes memory the group reads.  Each group of two or more calls
becomes one ``fused_elementwise(program, inputs)`` call at the place of its last call,
``program`` being plain data (``backends/fused_program.py``): op names and numbers,
stored with the plan and turned into an njit loop (Numba) or a CUDA kernel (CuPy)
by the backend; the NumPy backend runs it one op at a time.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

import numpy as np

from ... import backends
from ...backends import fused_program
from ..graph import Graph, Node, Ref, Value, node_refs
from ..plan import made_by

_SCALARS = (bool, int, float)


@dataclasses.dataclass(eq=False)
class _Group:
    root: Node
    position: int  # the root's
    code: list[tuple]  # the root's own instructions; operands ("in", value) or ("tmp", k)
    first: int  # position of the earliest member
    inputs: set[int]  # values read from outside the group
    merged: dict[int, "_Group"] = dataclasses.field(default_factory=dict)  # operand value -> its group
    size: int = 1


def fuse_elementwise(graph: Graph) -> Graph:
    values = list(graph.values)
    view = viewer(values)
    backend = backends.load(graph.backend)
    exact = (getattr(backend, "fused_unary", fused_program.UNARY), getattr(backend, "fused_binary", fused_program.BINARY))
    readers, writes, returned = usage(graph, values)
    open_groups: dict[int, _Group] = {}  # result value -> group, while its result is unread
    groups: dict[int, _Group] = {}  # by root position
    for position, node in enumerate(graph.nodes):
        code = _describe(graph, node, values, view, exact)
        if code is None:
            continue
        out = node.out.value
        group = _Group(node, position, code, position, {v for ins in code for v in _operands(ins)})
        for v in sorted(group.inputs):
            producer = open_groups.get(v)
            if producer is None or not _may_join(graph, values, producer, node, position, v,
                                                 readers, writes, returned):
                continue
            joined = (group.inputs - {v}) | producer.inputs
            if len(joined) > fused_program.MAX_INPUTS:
                continue
            group.inputs, group.first = joined, min(group.first, producer.first)
            group.merged[v] = producer
            group.size += producer.size
            del groups[producer.position]
            del open_groups[v]
        open_groups[out] = group
        groups[position] = group
    fused = {g.root.index: g for g in groups.values() if g.size > 1}
    if not fused:
        return graph
    members = set()
    for g in fused.values():
        members |= _member_indices(g)
    nodes, storages = [], list(graph.storages)
    for node in graph.nodes:
        if node.index in fused:
            nodes.append(_fused_node(fused[node.index], values))
            out = values[node.out.value]  # the kernel's result is the whole block, C-contiguous
            storages[out.storage] = dataclasses.replace(storages[out.storage], root=(out.shape, out.strides, out.dtype))
        elif node.index not in members:
            nodes.append(node)
    stats = dict(graph.stats)
    stats["fused_elementwise"] = stats.get("fused_elementwise", 0) + len(fused)
    stats["fused_ops"] = stats.get("fused_ops", 0) + sum(g.size for g in fused.values())
    return dataclasses.replace(graph, storages=storages, values=values, nodes=nodes, stats=stats)


def _operands(ins: tuple) -> list[int]:
    return [x[1] for x in ins[1:] if type(x) is tuple and x[0] == "in"]


def _member_indices(group: _Group) -> set[int]:
    found = {group.root.index}
    for sub in group.merged.values():
        found |= _member_indices(sub)
    return found


def _may_join(graph: Graph, values: list[Value], producer: _Group, node: Node, position: int, v: int,
              readers: dict, writes: dict, returned: set[int]) -> bool:
    """Whether the group that made value ``v`` may be folded into ``node``."""
    return (sole_reader(values, v, node, position, readers, returned)
            and values[v].shape == values[node.out.value].shape
            and unwritten(values, producer.inputs, producer.first, position, writes))


def viewer(values: list[Value]) -> Callable[[int, int, tuple, tuple, np.dtype], int]:
    """``view(storage, offset, shape, strides, dtype)``: the index of that view in
    ``values``, appended when it is not there yet."""
    views = {(v.storage, v.offset, v.shape, v.strides, v.dtype): v.index for v in values}

    def view(storage: int, offset: int, shape: tuple, strides: tuple, dtype: np.dtype) -> int:
        key = (storage, offset, shape, strides, dtype)
        if key not in views:
            views[key] = len(values)
            values.append(Value(len(values), *key))
        return views[key]
    return view


def usage(graph: Graph, values: list[Value]) -> tuple[dict[int, set[int]], dict[int, list[int]], set[int]]:
    """(storage -> positions of the calls reading it, storage -> positions of the calls
    writing it in place, storages holding a returned value)."""
    readers: dict[int, set[int]] = {}
    writes: dict[int, list[int]] = {}
    for position, node in enumerate(graph.nodes):
        for r in node_refs(node):
            readers.setdefault(values[r.value].storage, set()).add(position)
        for s in node.writes:
            writes.setdefault(s, []).append(position)
    return readers, writes, {values[r.value].storage for r in graph.output_refs()}


def sole_reader(values: list[Value], v: int, node: Node, position: int, readers: dict, returned: set[int]) -> bool:
    """Whether ``node`` (at ``position``) is the only reader of value ``v``'s memory:
    no other call, no other view, not returned."""
    storage = values[v].storage
    if storage in returned or readers.get(storage) != {position}:
        return False
    return not any(values[r.value].storage == storage and r.value != v for r in node_refs(node))


def unwritten(values: list[Value], inputs: Iterable[int], first: int, last: int, writes: dict) -> bool:
    """Whether no call strictly between positions ``first`` and ``last`` writes the
    memory of the values ``inputs`` (so reading them at ``last`` reads what ``first`` did)."""
    for s in {values[i].storage for i in inputs}:
        if any(first < w < last for w in writes.get(s, ())):
            return False
    return True


def owns_block(graph: Graph, node: Node, values: list[Value]) -> bool:
    """Whether ``node`` returns one array that is a C-contiguous block of its own (it
    allocated it, fills it, and nothing writes it in place)."""
    if type(node.out) is not Ref:
        return False
    out = values[node.out.value]
    storage = graph.storages[out.storage]
    return (not storage.written and made_by(graph, node) == {out.storage} and out.offset == 0
            and out.strides == c_strides(out.shape, out.dtype.itemsize) and storage.origin == 0 and out.nbytes == storage.nbytes)


def _fused_node(group: _Group, values: list[Value]) -> Node:
    """The call running a whole group: its inputs, in the order they are first read."""
    inputs: list[int] = []
    code: list[tuple] = []

    def emit(g: _Group) -> Any:
        done: dict[int, Any] = {}
        local: list[Any] = []
        for ins in g.code:
            mapped = [ins[0]]
            for x in ins[1:]:
                if type(x) is tuple and x[0] == "in":
                    v = x[1]
                    if v not in done:
                        if v in g.merged:
                            done[v] = emit(g.merged[v])
                        else:
                            if v not in inputs:
                                inputs.append(v)
                            done[v] = ("in", inputs.index(v))
                    x = done[v]
                elif type(x) is tuple:
                    x = local[x[1]]
                mapped.append(x)
            code.append(tuple(mapped))
            local.append(("tmp", len(code) - 1))
        return local[-1]

    emit(group)
    n = len(inputs)

    def register(x: Any) -> Any:
        if type(x) is tuple:
            return x[1] if x[0] == "in" else n + x[1]
        return x

    program = (tuple(values[v].dtype.name for v in inputs),
               tuple(tuple(register(x) for x in ins) for ins in code))
    root = group.root
    return Node(root.index, "fused_elementwise", (program, [Ref(v) for v in inputs]), {}, root.out)


def _describe(graph: Graph, node: Node, values: list[Value], view: Any, exact: tuple) -> list[tuple] | None:
    """The call as program instructions (operands ("in", value) or ("tmp", k)), or None
    when it is not fusable (``exact``: the unary and binary ops the backend's fused
    kernels compute exactly as its eager calls do)."""
    if node.writes or node.effect or node.kwargs or not owns_block(graph, node, values):
        return None
    out = values[node.out.value]
    if out.dtype.name not in fused_program.DTYPES:
        return None
    args = node.args
    if node.op == "unary" and len(args) == 2 and args[0] in exact[0]:
        code = _call("unary", args[0], [args[1]], values)
    elif node.op == "binary" and len(args) == 3 and args[0] in exact[1]:
        code = _call("binary", args[0], list(args[1:]), values)
    elif node.op == "where" and len(args) == 3 and type(args[0]) is Ref:
        code = _call("where", None, list(args), values)
    elif node.op == "bias_act" and len(args) == 4:
        code = _bias_act(args, values, view)
    else:
        return None
    if code is None:
        return None
    try:
        inputs = sorted({v for ins in code for v in _operands(ins)})
        kinds = fused_program.check((tuple(values[v].dtype.name for v in inputs),
                                     tuple(_numbered(ins, inputs) for ins in code)))
    except ValueError:
        return None
    return code if kinds[-1] == out.dtype.name else None


def _numbered(ins: tuple, inputs: list[int]) -> tuple:
    """An instruction with registers numbered as in a program of ``inputs``."""
    return tuple(x if type(x) is not tuple else
                 (inputs.index(x[1]) if x[0] == "in" else len(inputs) + x[1]) for x in ins)


def _call(kind: str, op: str | None, operands: list[Any], values: list[Value]) -> list[tuple] | None:
    """One unary / binary / where call; scalar operands become constants of the dtype
    NumPy computes in (the arrays' own: mixed-dtype calls are not fused)."""
    arrays = [values[a.value].dtype for a in operands if type(a) is Ref]
    scalars = [a for a in operands if type(a) is not Ref]
    if not arrays or any(not (type(a) in _SCALARS or isinstance(a, np.generic)) for a in scalars):
        return None
    data = arrays[1:] if kind == "where" else arrays  # where's condition is its own dtype
    if kind == "where" and type(operands[0]) is not Ref:
        return None
    try:
        loop = np.result_type(*data, *scalars) if data else np.result_type(*scalars)
    except TypeError:
        return None
    if any(d != loop for d in data) or loop.name not in fused_program.DTYPES:
        return None
    code: list[tuple] = []
    regs: list[tuple] = []
    for i, a in enumerate(operands):
        if type(a) is Ref:
            regs.append(("in", a.value))
            continue
        value = a.item() if isinstance(a, np.generic) else a
        value = bool(value) if loop.name == "bool" else float(value)
        if not (kind == "where" and i == 0):
            code.append(("const", loop.name, value))
            regs.append(("tmp", len(code) - 1))
    code.append((kind, op, *regs) if op is not None else (kind, *regs))
    return code


def _bias_act(args: tuple, values: list[Value], view: Any) -> list[tuple] | None:
    """bias_act(x, bias, act, axis): x + bias viewed along ``axis``, then the activation."""
    x, bias, act, axis = args
    if type(x) is not Ref or type(bias) is not Ref or type(axis) is not int \
            or act not in ("none",) + fused_program.ACTS:
        return None
    xv, bv = values[x.value], values[bias.value]
    if bv.dtype != xv.dtype or len(bv.shape) != 1 or not -len(xv.shape) <= axis < len(xv.shape) \
            or bv.shape[0] != xv.shape[axis]:
        return None
    trailing = len(xv.shape) - axis % len(xv.shape) - 1
    along = view(bv.storage, bv.offset, bv.shape + (1,) * trailing, bv.strides + (0,) * trailing, bv.dtype)
    code = [("binary", "add", ("in", x.value), ("in", along))]
    if act != "none":
        code.append(("act", act, ("tmp", 0)))
    return code


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The strides (bytes) of a C-contiguous array of ``shape``."""
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))
