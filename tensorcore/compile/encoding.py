"""A lowered plan as plain JSON-ready data, and back, with every field checked.

Nothing in the data is executed: operations are backend method names from the
protocol's allowlist, arguments are decoded from a closed set of tagged literals, every
view is checked to lie inside its buffer, and the stored lowering must equal the one
recomputed from the stored graph.  External buffers are bound by name (the parameters
and buffers of the modules), random generators by device.  Plans with host-side
effects or guards (an optimizer step), or bound to memory that has no stable name,
have no plain-data form (``NotEncodable``): they are kept in memory only.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np

from .. import dtypes, versions
from ..backends.base import Backend
from ..backends.geometry import extent
from ..random import default_generator
from ..tensor import Tensor
from .graph import Graph, Node, Obj, Ref, Storage, Value
from .plan import Plan, lower

FORMAT = 2  # the layout of an encoded plan; part of the model identity


class NotEncodable(Exception):
    """The plan holds something that has no plain-data form (kept in memory only)."""


class CacheFileError(ValueError):
    """A cache file is not a valid plan for this call."""


_DTYPES = {name: np.dtype(name) for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                              "uint32", "uint64", "float16", "float32", "float64",
                                              "complex64", "complex128")}
_DTYPE_NAMES = frozenset(_DTYPES) | {"bfloat16"}  # bfloat16's dtype is made on first use (dtypes.py)
_TYPES = {f"numpy.{name}": dt.type for name, dt in _DTYPES.items()}
_TYPES.update({"builtins.bool": bool, "builtins.int": int, "builtins.float": float})
_TYPE_NAMES = {v: k for k, v in _TYPES.items()}


def _type_name(x: type) -> str | None:
    """The name a scalar type is written under, or None."""
    found = _TYPE_NAMES.get(x)
    bfloat16 = dtypes.loaded_bfloat16() if found is None else None
    return "numpy.bfloat16" if bfloat16 is not None and x is bfloat16.type else found
OPS = frozenset(name for name, attr in vars(Backend).items() if callable(attr) and not name.startswith("_")
                ) - {"to_numpy", "rng", "executor"} | {"constant"}


def _host_array(a: Any) -> dict:
    a = np.ascontiguousarray(a)
    return {"array": [a.dtype.name, list(a.shape), base64.b64encode(a.tobytes()).decode("ascii")]}


def _encode(x: Any) -> Any:
    kind = type(x)
    if x is None or kind in (bool, int, str):
        return x
    if kind is float:
        return {"float": repr(x)}
    if kind is Ref:
        return {"ref": x.value}
    if kind is Obj:
        return {"obj": x.index}
    if kind is tuple or kind is list:
        return {kind.__name__: [_encode(i) for i in x]}
    if kind is dict:
        if not all(type(k) is str for k in x):
            raise NotEncodable("dict keys")
        return {"dict": {k: _encode(v) for k, v in x.items()}}
    if kind is slice:
        return {"slice": [_encode(x.start), _encode(x.stop), _encode(x.step)]}
    if x is Ellipsis:
        return {"ellipsis": 0}
    if isinstance(x, np.dtype) and x.name in _DTYPE_NAMES:
        return {"dtype": x.name}
    if isinstance(x, type) and _type_name(x) is not None:
        return {"type": _type_name(x)}
    if isinstance(x, np.generic) and x.dtype.name in _DTYPE_NAMES:
        return {"scalar": [x.dtype.name, _encode(x.item())]}
    if kind is np.ndarray and x.dtype.name in _DTYPE_NAMES:
        return _host_array(x)
    raise NotEncodable(kind.__name__)


def encode(plan: Plan, to_host: Any) -> dict:
    """The plan as JSON-ready data (raises NotEncodable)."""
    g = plan.graph
    if g.effects or g.guards:
        raise NotEncodable("host effects or guards")
    if any(s.kind == "external" and s.name is None for s in g.storages) or None in g.object_names:
        raise NotEncodable("memory without a stable name")
    storages = [[s.kind, s.nbytes, s.origin, list(s.root[0]), list(s.root[1]), s.root[2].name, s.input_index,
                 s.name, s.producer, s.written] for s in g.storages]
    values = [[v.storage, v.offset, list(v.shape), list(v.strides), v.dtype.name] for v in g.values]
    nodes = [[n.index, n.op, _encode(n.args), _encode(n.kwargs), _encode(n.out), list(n.writes), n.effect,
              None if n.data is None else _host_array(to_host(n.data))] for n in g.nodes]
    return {"backend": g.backend, "device": g.device, "storages": storages, "values": values, "nodes": nodes,
            "objects": list(g.object_names), "inputs": list(g.inputs), "outputs": _encode(g.outputs),
            "lowered": _lowered(plan)}


def _lowered(plan: Plan) -> dict:
    return {"init": plan.init, "steps": plan.steps, "fixed_bytes": plan.fixed_bytes,
            "arena_bytes": plan.arena_bytes, "intermediate_bytes": plan.intermediate_bytes,
            "writeback": plan.writeback,
            "placement": sorted([s, kind, offset] for s, (kind, offset) in plan.placement.items())}


# ----- decoding, with every field checked ------------------------------------------------
def need(ok: bool, what: str) -> None:
    """Raise CacheFileError(what) unless ``ok``."""
    if not ok:
        raise CacheFileError(what)


def _int(x: Any, what: str, low: int = 0, high: int | None = None) -> int:
    need(type(x) is int and x >= low and (high is None or x < high), f"{what}: bad integer {x!r}")
    return x


def _ints(x: Any, what: str, low: int | None = 0) -> tuple[int, ...]:
    need(type(x) is list and all(type(i) is int and (low is None or i >= low) for i in x), f"{what}: bad list")
    return tuple(x)


def _dtype(x: Any) -> np.dtype:
    need(type(x) is str and x in _DTYPE_NAMES, f"unknown dtype {x!r}")
    return dtypes.bfloat16_dtype() if x == "bfloat16" else _DTYPES[x]


def _decode_array(x: Any) -> np.ndarray:
    need(type(x) is list and len(x) == 3 and type(x[2]) is str, "bad array")
    dtype, shape = _dtype(x[0]), _ints(x[1], "array shape")
    raw = base64.b64decode(x[2].encode("ascii"), validate=True)
    need(len(raw) == math.prod(shape) * dtype.itemsize, "array data of the wrong size")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _decode(x: Any, n_values: int, n_objects: int) -> Any:
    if x is None or type(x) in (bool, int, str):
        return x
    need(type(x) is dict and len(x) == 1, f"bad literal {x!r:.60}")
    (tag, v), = x.items()
    if tag == "ref":
        return Ref(_int(v, "ref", 0, n_values))
    if tag == "obj":
        return Obj(_int(v, "obj", 0, n_objects))
    if tag in ("tuple", "list"):
        need(type(v) is list, f"bad {tag}")
        items = [_decode(i, n_values, n_objects) for i in v]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict":
        need(type(v) is dict, "bad dict")
        return {k: _decode(i, n_values, n_objects) for k, i in v.items()}
    if tag == "float":
        need(type(v) is str and len(v) < 40, "bad float")
        return float(v)
    if tag == "slice":
        need(type(v) is list and len(v) == 3, "bad slice")
        parts = [_decode(i, n_values, n_objects) for i in v]
        need(all(p is None or type(p) is int for p in parts), "bad slice")
        return slice(*parts)
    if tag == "ellipsis":
        return Ellipsis
    if tag == "dtype":
        return _dtype(v)
    if tag == "type":
        need(type(v) is str and (v in _TYPES or v == "numpy.bfloat16"), f"unknown type {v!r}")
        return dtypes.bfloat16_dtype().type if v == "numpy.bfloat16" else _TYPES[v]
    if tag == "scalar":
        need(type(v) is list and len(v) == 2, "bad scalar")
        value = _decode(v[1], n_values, n_objects)
        need(type(value) in (bool, int, float), "bad scalar")
        return _dtype(v[0]).type(value)
    if tag == "array":
        return _decode_array(v)
    raise CacheFileError(f"unknown tag {tag!r}")


def _inside(v: Value, nbytes: int) -> bool:
    """Whether every element of ``v`` lies inside its storage's ``nbytes``."""
    if math.prod(v.shape) == 0:
        return 0 <= v.offset <= nbytes
    low = v.offset + sum((n - 1) * s for n, s in zip(v.shape, v.strides) if s < 0)
    high = v.offset + sum((n - 1) * s for n, s in zip(v.shape, v.strides) if s > 0) + v.dtype.itemsize
    return low >= 0 and high <= nbytes


def decode(data: Any, named: list[tuple[str, Tensor]], backend: Any, inputs: list[Any]) -> tuple[Plan, dict[int, Any]]:
    """The plan in ``data`` checked and bound to this process: (plan, external roots)."""
    need(type(data) is dict, "plan is not an object")
    need(data.get("backend") == backend.name and data.get("device") == backend.device, "plan of another backend")
    raw_storages, raw_values, raw_nodes = data.get("storages"), data.get("values"), data.get("nodes")
    need(all(type(x) is list for x in (raw_storages, raw_values, raw_nodes)), "plan lists missing")
    tensors = dict(named)
    roots: dict[int, Any] = {}
    storages = []
    for i, s in enumerate(raw_storages):
        need(type(s) is list and len(s) == 10, "bad storage")
        kind, nbytes, origin = s[0], _int(s[1], "nbytes"), _int(s[2], "origin")
        need(kind in ("input", "external", "fresh", "data"), f"bad storage kind {kind!r}")
        root = (_ints(s[3], "root shape"), _ints(s[4], "root strides", None), _dtype(s[5]))
        storage = Storage(i, kind, nbytes, origin, root, None if s[6] is None else _int(s[6], "input"),
                          s[7] if type(s[7]) is str else None, None if s[8] is None else _int(s[8], "producer"),
                          s[9] is True)
        if kind == "external":
            t = tensors.get(storage.name)
            need(t is not None, f"no tensor named {storage.name!r}")
            array = t.data
            need(versions.storage(array) is array and (tuple(array.shape), tuple(array.strides), array.dtype) == root
                  and extent(array)[1] == nbytes, f"{storage.name!r} changed")
            roots[i] = array
        storages.append(storage)
    values = []
    for i, v in enumerate(raw_values):
        need(type(v) is list and len(v) == 5, "bad value")
        value = Value(i, _int(v[0], "storage", 0, len(storages)), _int(v[1], "offset"), _ints(v[2], "shape"),
                      _ints(v[3], "strides", None), _dtype(v[4]))
        need(len(value.shape) == len(value.strides) and _inside(value, storages[value.storage].nbytes),
              "a view outside its buffer")
        values.append(value)
    objects = []
    for name in data.get("objects", []):
        need(name == f"rng:{backend.device}", f"unknown object {name!r}")
        objects.append(default_generator(backend.device).state_object)
    nodes = []
    for n in raw_nodes:
        need(type(n) is list and len(n) == 8 and n[1] in OPS, f"bad node {str(n)[:60]}")
        index = _int(n[0], "node index", nodes[-1].index + 1 if nodes else 0)
        args, kwargs, out = (_decode(x, len(values), len(objects)) for x in n[2:5])
        need(type(args) is tuple and type(kwargs) is dict, "bad call")
        writes = tuple(_int(w, "writes", 0, len(storages)) for w in _ints(n[5], "writes"))
        constant = None
        if n[7] is not None:
            need(type(n[7]) is dict and set(n[7]) == {"array"}, "bad constant")
            constant = backend.from_numpy(_decode_array(n[7]["array"]))
        need((n[1] == "constant") == (constant is not None), "constant without data")
        nodes.append(Node(index, n[1], args, kwargs, out, writes, n[6] is True, constant))
    graph = Graph(backend.name, backend.device, storages, values, nodes, objects, list(data["objects"]),
                  [_int(v, "input", 0, len(values)) for v in _ints(data.get("inputs"), "inputs")],
                  _decode(data.get("outputs"), len(values), len(objects)))
    need(len(graph.inputs) == len(inputs), "wrong number of inputs")
    for position, (v, a) in enumerate(zip(graph.inputs, inputs)):
        value, storage = values[v], storages[values[v].storage]
        need(storage.kind == "input" and storage.input_index == position and value.shape == tuple(a.shape)
              and value.dtype == a.dtype and value.nbytes == storage.nbytes, "inputs do not match")
    plan = lower(graph)
    need(json.loads(json.dumps(_lowered(plan))) == data.get("lowered"), "lowering does not match")
    return plan, roots
