"""Epilogue fusion: the elementwise calls after a convolution or a GEMM run in its epilogue.

A ``conv2d`` call computes ``(act(conv + bias) + residual) * residual_scale``.  Its
result, when the next call is its only reader (no other call, no view, not a returned
value; ``uses.Uses``), takes in, in that order and each at most once:

* ``unary(act, y)`` -> ``act=`` (an activation of ``ACTIVATIONS``), and
  ``bias_act(y, bias, act, axis=1)`` -> ``bias=``, ``act=``, while the conv has no
  bias (for bias_act), activation, residual or scale yet;
* ``binary('add', y, r)`` or ``binary('add', r, y)`` with ``r`` of the result's shape
  and dtype -> ``residual=r``, while there is no scale yet;
* ``binary('mul', y, s)``, ``binary('mul', s, y)`` with a Python number ``s`` (or a
  0-d ``full`` of y's dtype, as ``2 * y`` makes; the ``full`` goes too) ->
  ``residual_scale=s`` (as the array's dtype rounds it), and ``binary('div', y, s)``
  when ``1 / s`` is exact in that dtype (a power of two: ``y * (1 / s)`` then rounds
  exactly as ``y / s``), while the scale is 1.

A ``matmul(a, b)`` whose result only ``bias_act(y, bias, act, axis=-1)`` reads becomes
one ``matmul_bias_act(a, b, bias, act)`` call, which takes in a following
``unary(act, y)`` as well when bias_act had no activation (a Linear, then SiLU), or a
following ``binary('add', y, r)`` as ``residual=r`` (a transformer block's skip around
its output projection), after which nothing more folds.

When both operands of an add are open convolutions, a 1x1 one is tried last (see
``_pointwise``).  The fused call takes the place of the last call it absorbed, so the
convolution's or product's own arguments must not be written in between; its result is
that call's.
The backends compute the epilogue with the same operations in the same order; where a
kernel fuses them in registers (the GPU convolution) the results agree to rounding.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import numpy as np

from ...backends.base import ACTIVATIONS, Backend
from ..graph import Graph, Node, Ref, Value, node_refs
from .uses import ACTS, Uses, call_arguments, fresh_block, full_call, rewritten

_CONV = inspect.signature(Backend.conv2d)
_EPILOGUE_DEFAULTS = {"bias": None, "act": "none", "residual": None, "residual_scale": 1.0}


@dataclasses.dataclass(eq=False)
class _Open:
    """A conv or GEMM call whose epilogue may still grow: the call as rewritten so far,
    the position of the original call, the storages it reads there, the position it now
    sits at."""

    node: Node
    first: int
    reads: set[int]
    position: int


def fuse_epilogue(graph: Graph) -> Graph:
    values = graph.values
    uses = Uses.of(graph, values)
    numbers = _Numbers(graph, values)
    open_calls: dict[int, _Open] = {}  # result value -> call
    placed: dict[int, Node | None] = {}  # position -> its new call (None: folded away)
    folded = 0
    for position, node in enumerate(graph.nodes):
        candidates = [r.value for r in node_refs(node) if r.value in open_calls]
        candidates.sort(key=lambda v: _pointwise(open_calls[v].node, values))
        for v in candidates:
            call = open_calls[v]
            if not (uses.only_reader(values, v, node, position) and uses.unwritten(call.reads, call.first, position)):
                continue
            fused = _fold(graph, call.node, node, v, values, numbers)
            if fused is None:
                continue
            placed[call.position], placed[position] = None, fused
            for r in set(node_refs(node)) - set(node_refs(fused)) - {Ref(v)}:  # a scale's `full` read only here
                made_at = numbers.position(r)
                if made_at is not None and uses.only_reader(values, r.value, node, position):
                    placed[made_at] = None
            del open_calls[v]
            if fused.op == "conv2d" or fused.args[3] == "none":  # a residual, scale or activation may follow
                reads = call.reads | {values[r.value].storage for r in node_refs(fused)}
                open_calls[fused.out.value] = dataclasses.replace(call, node=fused, reads=reads, position=position)
            folded += 1
            break
        else:
            start = _start(graph, node, values)
            if start is not None:
                open_calls[node.out.value] = _Open(start, position, {values[r.value].storage for r in node_refs(start)},
                                                   position)
    if not folded:
        return graph
    return rewritten(graph, placed, "fuse_epilogue", folded)


class _Numbers:
    """The numbers one-element ``full`` calls made (``2 * y`` makes one for the 2)."""

    def __init__(self, graph: Graph, values: list[Value]) -> None:
        self.graph, self.values = graph, values
        self.positions = {node.index: p for p, node in enumerate(graph.nodes)}

    def position(self, ref: Ref) -> int | None:
        """The position of the ``full`` call that made ``ref``, when one did."""
        return full_call(self.graph, self.values, self.positions, ref)

    def value(self, operand: Any, dtype: np.dtype) -> Any:
        """A Python number operand as it is, a one-element ``full`` of ``dtype`` as its number."""
        if type(operand) is not Ref:
            return operand
        position = self.position(operand)
        if position is None or self.values[operand.value].dtype != dtype:
            return None
        return self.graph.nodes[position].args[1]


def _pointwise(call: Node, values: list[Value]) -> bool:
    """Whether ``call`` is a 1x1 convolution: such a call may run as a plain GEMM whose
    epilogue is separate kernels (cuBLAS on the GPU), so a residual both it and a spatial
    convolution could take goes to the spatial one, which fuses it."""
    return call.op == "conv2d" and values[call.args[1].value].shape[2:] == (1, 1)


def _start(graph: Graph, node: Node, values: list[Value]) -> Node | None:
    """``node`` in the form the folds extend (conv2d with its epilogue as keywords), when
    it is a conv2d or matmul call whose result is a fresh block; else None."""
    if node.op not in ("conv2d", "matmul") or node.writes or node.effect or type(node.out) is not Ref \
            or not fresh_block(graph, node, values[node.out.value]):
        return None
    if node.op == "matmul":
        ok = len(node.args) == 2 and not node.kwargs and all(type(a) is Ref for a in node.args)
        return node if ok else None
    params = call_arguments(_CONV, node)
    if params is None:
        return None
    geometry = tuple(params.pop(name) for name in ("x", "w", "stride", "padding", "dilation", "groups"))
    epilogue = {name: value for name, value in params.items() if value != _EPILOGUE_DEFAULTS[name]}
    return dataclasses.replace(node, args=geometry, kwargs=epilogue)


def _fold(graph: Graph, call: Node, node: Node, v: int, values: list[Value], numbers: _Numbers) -> Node | None:
    """``call`` (conv2d or matmul, result value ``v``) with ``node`` folded in, or None."""
    if node.writes or node.effect or node.kwargs or type(node.out) is not Ref:
        return None
    y, out = values[v], values[node.out.value]
    if (out.shape, out.dtype) != (y.shape, y.dtype) or not fresh_block(graph, node, out):
        return None
    if call.op == "matmul":
        if node.op != "bias_act" or node.args[0] != Ref(v) or not _along(node.args, y, len(y.shape) - 1, values):
            return None
        return Node(node.index, "matmul_bias_act", (*call.args, node.args[1], node.args[2]), {}, node.out)
    if call.op == "matmul_bias_act":
        if call.kwargs:  # the residual is added last: nothing folds after it
            return None
        residual = _residual(node, v, y, values)
        if residual is not None:
            return Node(node.index, "matmul_bias_act", call.args, {"residual": residual}, node.out)
        if node.op != "unary" or node.args[1:] != (Ref(v),) or node.args[0] not in ACTS or call.args[3] != "none":
            return None
        return Node(node.index, "matmul_bias_act", (*call.args[:3], node.args[0]), {}, node.out)
    epilogue = _conv_epilogue(call.kwargs, node, v, y, values, numbers)
    if epilogue is None:
        return None
    return Node(node.index, "conv2d", call.args, epilogue, node.out)


def _conv_epilogue(kwargs: dict, node: Node, v: int, y: Value, values: list[Value],
                   numbers: _Numbers) -> dict | None:
    """The conv's epilogue keywords with ``node`` folded in, or None when it does not
    continue the epilogue's order ``(act(y + bias) + residual) * residual_scale``."""
    plain = "act" not in kwargs and "residual" not in kwargs and "residual_scale" not in kwargs
    args = node.args
    if node.op == "unary" and len(args) == 2 and args[1] == Ref(v) and args[0] in ACTS and plain:
        return {**kwargs, "act": args[0]}
    if node.op == "bias_act" and args[0] == Ref(v) and plain and "bias" not in kwargs and _along(args, y, 1, values):
        return {**kwargs, **({} if args[1] is None else {"bias": args[1]}), "act": args[2]}
    if node.op != "binary" or len(args) != 3 or "residual_scale" in kwargs:
        return None
    op, a, b = args
    if op == "add" and "residual" not in kwargs:
        residual = _residual(node, v, y, values)
        return None if residual is None else {**kwargs, "residual": residual}
    if op == "mul":
        scalar = b if a == Ref(v) else a if b == Ref(v) else None
        scale = _scalar(numbers.value(scalar, y.dtype), y.dtype)
    elif op == "div" and a == Ref(v):
        scale = _exact_reciprocal(_scalar(numbers.value(b, y.dtype), y.dtype), y.dtype)
    else:
        return None
    return None if scale is None else {**kwargs, "residual_scale": scale}


def _residual(node: Node, v: int, y: Value, values: list[Value]) -> Ref | None:
    """The other operand of ``node`` when it is ``binary('add', y, r)`` or ``('add', r, y)``
    with ``r`` another array of y's shape and dtype, else None."""
    if node.op != "binary" or len(node.args) != 3 or node.args[0] != "add":
        return None
    _, a, b = node.args
    other = b if a == Ref(v) else a if b == Ref(v) else None
    if type(other) is Ref and other != Ref(v) and values[other.value].shape == y.shape \
            and values[other.value].dtype == y.dtype:
        return other
    return None


def _along(args: tuple, y: Value, axis: int, values: list[Value]) -> bool:
    """Whether bias_act's ``args`` (x, bias, act, axis) put a bias of y's dtype along
    ``axis`` of y and name a known activation."""
    _, bias, act, at = args
    if act not in ACTIVATIONS or type(at) is not int or not -len(y.shape) <= at < len(y.shape) \
            or at % len(y.shape) != axis:
        return False
    if bias is None:
        return True
    b = values[bias.value] if type(bias) is Ref else None
    return b is not None and b.shape == (y.shape[axis],) and b.dtype == y.dtype


def _scalar(s: Any, dtype: np.dtype) -> float | None:
    """A Python number as NumPy rounds it into an array of ``dtype`` (a weak scalar),
    or None for anything else (arrays, bools, NumPy scalars, which promote)."""
    if type(s) not in (int, float) or not np.issubdtype(dtype, np.floating):
        return None
    value = float(dtype.type(s))
    return value if math.isfinite(value) else None


def _exact_reciprocal(s: float | None, dtype: np.dtype) -> float | None:
    """1 / s when it is exact in ``dtype`` (s a power of two), so that multiplying by it
    rounds as dividing by s does; else None."""
    if s is None or s == 0 or abs(math.frexp(s)[0]) != 0.5:
        return None
    r = 1.0 / s
    return r if float(dtype.type(r)) == r and r != 0 and math.isfinite(r) else None
