"""Cache keys, the in-memory LRU of plans, and the disk cache of lowered plans.

**Key.**  A call's key holds what the plan depends on: each tensor argument's shape,
dtype, device and requires_grad, every other argument by value (static arguments),
which tensor arguments are the same tensor, grad mode, the matmul precision, the
backend serving the CPU and the default device, each module's ``training`` flags and
its ``structure_version`` (replacing a parameter, adding a layer, a LoRA merge or a
VAE tiling flip changes it; new parameter *values* do not).  ``key`` also returns the
*stable* part -- everything but the structure versions, which are counters of this
process -- that names the plan on disk, or None when an argument cannot be named
across processes (a module or an arbitrary object passed as an argument).

**Disk.**  ``DiskCache`` keeps lowered plans under ``<cache dir>/compile/<model
identity>/<key>.json`` (``TENSORCORE_CACHE_DIR``, default ``~/.cache/tensorcore``).
The model identity hashes the module tree's classes (their code), ``extra_repr``,
config, parameter and buffer names, shapes and dtypes -- never their values -- with
the tensorcore version and a digest of tensorcore's sources (kernels included), so a
plan made by other code is never reused.  A file is JSON with a SHA-256 checksum of
its body; nothing in it is executed: operations are backend method names from the
protocol's allowlist, arguments are decoded from a closed set of tagged literals,
every view is checked to lie inside its buffer, and the stored lowering must equal the
one recomputed from the stored graph.  External buffers are bound by name (the
parameters and buffers of the modules), random generators by device.  A file that is
truncated, corrupted, stale, or not ours is ignored, logged once, and rewritten by the
next trace.  Plans with host-side effects or guards (an optimizer step), or bound to
memory that has no stable name, are kept in memory only.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import math
import operator
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from .. import __version__, autograd, backends, dtypes, settings
from ..atomic import write_atomic
from ..backends.base import Backend
from ..random import default_generator
from ..tensor import Tensor
from .graph import Graph, Node, Obj, Ref, Storage, Value
from .plan import Plan, lower
from ..backends.geometry import extent, owner

log = logging.getLogger("tensorcore.compile")

FORMAT = 1
MAX_FILE_BYTES = 256 << 20
T = TypeVar("T")


# ----- keys ------------------------------------------------------------------------------
def key(args: tuple, kwargs: dict, roots: list[tuple[str, Any]], modes_of: Any,
        checked: "tuple[Layout, list[Tensor]] | None" = None) -> tuple[Any, list[Tensor], Any]:
    """(key, the tensor arguments in order, the stable part of the key or None);
    ``modes_of(root, version)`` is the tuple of a root's submodules' ``training`` flags;
    ``checked``, what ``LastSpec.check`` found of a call without keyword arguments."""
    if checked is not None:
        layout, tensors = checked
        spec, stable = layout.spec, [layout.stable]
    else:
        tensors, stable = [], [True]
        spec = (("tuple", *_items_spec(args, tensors, stable)), _spec(kwargs, tensors, stable) if kwargs else ("dict",))
    alias = ()
    if len(tensors) > 1:
        ids = [id(t.data) for t in tensors]
        if len(set(ids)) < len(ids):
            alias = tuple(ids.index(i) for i in ids)
    state = (autograd.is_grad_enabled(), settings.matmul_precision, backends.cpu_backend_name(), backends.default_device)
    trainings, versions = [], []
    for _, root in roots:
        version = root.structure_version
        versions.append(version)
        trainings.append(modes_of(root, version))
    fixed = (spec, alias, state, tuple(trainings))
    return (fixed, tuple(versions)), tensors, (fixed if stable[0] else None)


# the plain values a key holds as they are, by type (a dict lookup, not a chain of checks)
_LEAF_NAMES = {type(None): "NoneType", bool: "bool", int: "int", float: "float", str: "str", bytes: "bytes",
               complex: "complex"}


def _spec(obj: Any, tensors: list[Tensor], stable: list[bool]) -> Any:
    kind = type(obj)
    name = _LEAF_NAMES.get(kind)
    if name is not None:
        return (name, obj)
    if kind is tuple or kind is list:
        return (kind.__name__, *_items_spec(obj, tensors, stable))
    if isinstance(obj, Tensor):
        return _tensor_spec(obj, tensors)
    if kind is dict:
        return ("dict", *[(k, _spec(v, tensors, stable)) for k, v in obj.items()])
    if isinstance(obj, np.dtype):
        return ("dtype", obj.name)
    if isinstance(obj, np.generic):
        return ("scalar", obj.dtype.name, obj.item())
    if is_root_type(kind):  # a module argument: one of the call's roots
        return ("module",)
    stable[0] = False
    try:
        hash(obj)
    except TypeError as exc:
        raise TypeError(f"compile: an argument of type {kind.__name__} is neither a Tensor nor hashable, "
                        "so it cannot be part of the cache key") from exc
    return (kind.__qualname__, obj)


def _items_spec(items: Any, tensors: list[Tensor], stable: list[bool]) -> list:
    """The specs of a sequence's items, the common kinds (plain values, tensors) handled
    here rather than by a call each: a call's arguments are mostly those."""
    out = []
    for obj in items:
        kind = type(obj)
        name = _LEAF_NAMES.get(kind)
        if name is not None:
            out.append((name, obj))
        elif kind is Tensor:
            out.append(_tensor_spec(obj, tensors))
        else:
            out.append(_spec(obj, tensors, stable))
    return out


def _tensor_spec(t: Tensor, tensors: list[Tensor]) -> tuple:
    tensors.append(t)
    data = t.data
    return ("T", tuple(data.shape), data.dtype, t.device, t.requires_grad)


class LastSpec:
    """The spec of a callable's last call with positional arguments only, so that the
    next one is checked rather than rebuilt -- a loop calls with the same static
    arguments every time.  An argument passes when it is the very object of last time
    and cannot have changed since (a plain value, a tuple of them, any other hashable
    object: the key compares those by identity first too), a module where a module
    was, or a tensor of the same shape, dtype, device and requires_grad; any other
    argument (a list, a tuple holding tensors, a new object in a static place) has its
    spec rebuilt and compared.  A call that passes gets last time's spec object back,
    so the plan lookup compares it by identity."""

    def __init__(self) -> None:
        self._last: Layout | None = None

    def check(self, args: tuple) -> tuple["Layout", list[Tensor]]:
        """(the layout of a call with positional ``args`` -- its spec, whether that is
        stable, the positions of its module arguments --, its tensor arguments)."""
        last = self._last
        if last is not None and len(args) == last.count:
            tensors = last.tensors_of(args)
            if tensors is not None:
                return last, tensors
        tensors, stable = [], [True]
        items = tuple(_items_spec(args, tensors, stable))
        last = self._last = Layout(args, items, stable[0])
        return last, tensors


class Layout:
    """What ``LastSpec`` keeps of one call: its spec and, per argument position, how to
    check it."""

    def __init__(self, args: tuple, items: tuple, stable: bool) -> None:
        self.count, self.items, self.stable = len(args), items, stable
        self.spec = (("tuple", *items), ("dict",))
        kinds = [_check_kind(a, item) for a, item in zip(args, items)]
        self.same = [i for i, k in enumerate(kinds) if k == "same"]
        self.objects = [args[i] for i in self.same]
        self.modules = [i for i, k in enumerate(kinds) if k == "module"]
        self.tensors = [(i, items[i][1:]) for i, k in enumerate(kinds) if k == "tensor"]
        self.rebuilt = [(i, items[i]) for i, k in enumerate(kinds) if k == "rebuild"]

    def tensors_of(self, args: tuple) -> list[Tensor] | None:
        """The call's tensor arguments in order, or None when its spec differs."""
        get = args.__getitem__
        if not all(map(operator.is_, map(get, self.same), self.objects)):
            # another object in a static place (a float or a tuple of them computed anew
            # each call): an equal value of the same types has the same spec
            for i, obj in zip(self.same, self.objects):
                if args[i] is not obj and not _same_value(args[i], obj):
                    return None
        for i in self.modules:
            if not is_root_type(type(args[i])):
                return None
        tensors = []
        for i, (shape, dtype, device, requires_grad) in self.tensors:
            t = args[i]
            if type(t) is not Tensor:
                return None
            data = t.data
            if data.shape != shape or data.dtype != dtype or t.device != device or t.requires_grad != requires_grad:
                return None
            tensors.append(t)
        if not self.rebuilt:
            return tensors
        found: list[Tensor] = []
        for i, item in self.rebuilt:
            if _items_spec((args[i],), found, [True])[0] != item:
                return None
        if not found:
            return tensors
        ordered: list[Tensor] = []  # tensors nested in rebuilt arguments: all in argument order
        _items_spec(args, ordered, [True])
        return ordered


def _same_value(a: Any, b: Any) -> bool:
    """Whether ``a`` has ``b``'s spec, for ``b`` of a static place: the same type and an
    equal value (tuples item by item), as comparing their specs would find, unbuilt."""
    if type(a) is not type(b):
        return False
    if type(a) is tuple:
        return len(a) == len(b) and all(map(_same_value, a, b))
    return bool(a == b)


def _check_kind(obj: Any, item: tuple) -> str:
    """How ``LastSpec`` checks an argument next time: "tensor", "module" (any module
    has this spec: keeping it would only pin it), "same" (the same object has the same
    spec on every call: not a tensor, list or dict, nor a tuple holding one), else
    "rebuild"."""
    if item[0] == "T":
        return "tensor" if type(obj) is Tensor else "rebuild"
    if item[0] == "module":
        return "module"
    return "same" if _unchanging(obj) else "rebuild"


def _unchanging(obj: Any) -> bool:
    kind = type(obj)
    if kind is tuple:
        return all(map(_unchanging, obj))
    return kind is not list and kind is not dict and not isinstance(obj, Tensor)


_ROOT_TYPES: dict[type, bool] = {}


def is_root_type(kind: type) -> bool:
    """Whether instances of ``kind`` are modules (they carry a ``structure_version``);
    remembered per type, as a call asks it of every argument."""
    found = _ROOT_TYPES.get(kind)
    if found is None:
        found = _ROOT_TYPES[kind] = hasattr(kind, "structure_version")
    return found


# ----- the in-memory LRU -----------------------------------------------------------------
class LRU(Generic[T]):
    """At most ``capacity`` items; the least recently used goes first.  The most recent
    (key, item) is also kept aside: a call repeating the last key (a loop replaying one
    plan) costs one comparison, not two hashes and lookups of the nested key."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[Any, T] = OrderedDict()
        self._last: tuple[Any, T] | None = None  # the newest item, last in _items

    def get(self, key: Any) -> T | None:
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
            self._last = (key, item)
        return item

    def put(self, key: Any, item: T) -> list[T]:
        """Insert; returns the items pushed out (a replaced one included)."""
        out = [self._items.pop(key)] if key in self._items else []
        self._items[key] = item
        self._last = (key, item)
        while len(self._items) > self.capacity:
            out.append(self._items.popitem(last=False)[1])
        return out

    def pop(self, key: Any) -> T | None:
        if self._last is not None and self._last[0] == key:
            self._last = None
        return self._items.pop(key, None)

    def values(self) -> list[T]:
        return list(self._items.values())

    def clear(self) -> None:
        self._items.clear()
        self._last = None

    def __len__(self) -> int:
        return len(self._items)


# ----- model identity --------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def sources_digest() -> str:
    """A digest of tensorcore's Python and CUDA sources: plans of other code are stale."""
    package = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.suffix in (".py", ".cu", ".cuh")):
        h.update(str(path.relative_to(package)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _code(h: Any, code: Any) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            _code(h, const)
        else:
            h.update(repr(const).encode())


@functools.lru_cache(maxsize=None)
def _class_digest(cls: type) -> str:
    """A digest of the code of every method of ``cls`` and its bases."""
    h = hashlib.sha256()
    for klass in cls.__mro__:
        if klass is object:
            continue
        h.update(f"{klass.__module__}.{klass.__qualname__}".encode())
        for name, attr in sorted(vars(klass).items()):
            for fn in (attr, getattr(attr, "__func__", None), getattr(attr, "fget", None)):
                if hasattr(fn, "__code__"):
                    h.update(name.encode())
                    _code(h, fn.__code__)
    return h.hexdigest()


def identity(fn: Any, roots: list[tuple[str, Any]], passes: str = "") -> str:
    """The model identity: code and structure of the function and its modules, and the
    graph passes that made the plan (``passes.signature``)."""
    h = hashlib.sha256(f"{FORMAT}/{__version__}/{sources_digest()}/{passes}".encode())
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is not None:
        h.update(f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}".encode())
        _code(h, code)
    for prefix, root in roots:
        for name, module in root.named_modules(prefix):
            h.update(f"|{name}|{_class_digest(type(module))}|{module.extra_repr()}".encode())
            config = getattr(module, "config", None)
            if config is not None:
                h.update(json.dumps(config, sort_keys=True, default=str).encode())
            for kind, members in (("p", module._parameters), ("b", module._buffers)):
                for member, t in members.items():
                    spec = None if t is None else (tuple(t.shape), str(t.dtype), t.device)
                    h.update(f"{kind}:{member}:{spec}".encode())
    return h.hexdigest()


# ----- encoding a plan as plain data -----------------------------------------------------
class NotEncodable(Exception):
    """The plan holds something that has no plain-data form (kept in memory only)."""


class CacheFileError(ValueError):
    """A cache file is not a valid plan for this call."""


_DTYPES = {name: np.dtype(name) for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                              "uint32", "uint64", "float16", "float32", "float64",
                                              "complex64", "complex128")}
_DTYPES["bfloat16"] = dtypes.bfloat16
_TYPES = {f"numpy.{name}": dt.type for name, dt in _DTYPES.items()}
_TYPES.update({"builtins.bool": bool, "builtins.int": int, "builtins.float": float})
_TYPE_NAMES = {v: k for k, v in _TYPES.items()}
OPS = frozenset(name for name, attr in vars(Backend).items() if callable(attr) and not name.startswith("_")
                ) - {"to_numpy", "rng"} | {"constant"}


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
    if isinstance(x, np.dtype) and x.name in _DTYPES:
        return {"dtype": x.name}
    if isinstance(x, type) and x in _TYPE_NAMES:
        return {"type": _TYPE_NAMES[x]}
    if isinstance(x, np.generic) and x.dtype.name in _DTYPES:
        return {"scalar": [x.dtype.name, _encode(x.item())]}
    if kind is np.ndarray and x.dtype.name in _DTYPES:
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
def _need(ok: bool, what: str) -> None:
    if not ok:
        raise CacheFileError(what)


def _int(x: Any, what: str, low: int = 0, high: int | None = None) -> int:
    _need(type(x) is int and x >= low and (high is None or x < high), f"{what}: bad integer {x!r}")
    return x


def _ints(x: Any, what: str, low: int | None = 0) -> tuple[int, ...]:
    _need(type(x) is list and all(type(i) is int and (low is None or i >= low) for i in x), f"{what}: bad list")
    return tuple(x)


def _dtype(x: Any) -> np.dtype:
    _need(type(x) is str and x in _DTYPES, f"unknown dtype {x!r}")
    return _DTYPES[x]


def _decode_array(x: Any) -> np.ndarray:
    _need(type(x) is list and len(x) == 3 and type(x[2]) is str, "bad array")
    dtype, shape = _dtype(x[0]), _ints(x[1], "array shape")
    raw = base64.b64decode(x[2].encode("ascii"), validate=True)
    _need(len(raw) == math.prod(shape) * dtype.itemsize, "array data of the wrong size")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _decode(x: Any, n_values: int, n_objects: int) -> Any:
    if x is None or type(x) in (bool, int, str):
        return x
    _need(type(x) is dict and len(x) == 1, f"bad literal {x!r:.60}")
    (tag, v), = x.items()
    if tag == "ref":
        return Ref(_int(v, "ref", 0, n_values))
    if tag == "obj":
        return Obj(_int(v, "obj", 0, n_objects))
    if tag in ("tuple", "list"):
        _need(type(v) is list, f"bad {tag}")
        items = [_decode(i, n_values, n_objects) for i in v]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict":
        _need(type(v) is dict, "bad dict")
        return {k: _decode(i, n_values, n_objects) for k, i in v.items()}
    if tag == "float":
        _need(type(v) is str and len(v) < 40, "bad float")
        return float(v)
    if tag == "slice":
        _need(type(v) is list and len(v) == 3, "bad slice")
        parts = [_decode(i, n_values, n_objects) for i in v]
        _need(all(p is None or type(p) is int for p in parts), "bad slice")
        return slice(*parts)
    if tag == "ellipsis":
        return Ellipsis
    if tag == "dtype":
        return _dtype(v)
    if tag == "type":
        _need(type(v) is str and v in _TYPES, f"unknown type {v!r}")
        return _TYPES[v]
    if tag == "scalar":
        _need(type(v) is list and len(v) == 2, "bad scalar")
        value = _decode(v[1], n_values, n_objects)
        _need(type(value) in (bool, int, float), "bad scalar")
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
    _need(type(data) is dict, "plan is not an object")
    _need(data.get("backend") == backend.name and data.get("device") == backend.device, "plan of another backend")
    raw_storages, raw_values, raw_nodes = data.get("storages"), data.get("values"), data.get("nodes")
    _need(all(type(x) is list for x in (raw_storages, raw_values, raw_nodes)), "plan lists missing")
    tensors = dict(named)
    roots: dict[int, Any] = {}
    storages = []
    for i, s in enumerate(raw_storages):
        _need(type(s) is list and len(s) == 10, "bad storage")
        kind, nbytes, origin = s[0], _int(s[1], "nbytes"), _int(s[2], "origin")
        _need(kind in ("input", "external", "fresh", "data"), f"bad storage kind {kind!r}")
        root = (_ints(s[3], "root shape"), _ints(s[4], "root strides", None), _dtype(s[5]))
        storage = Storage(i, kind, nbytes, origin, root, None if s[6] is None else _int(s[6], "input"),
                          s[7] if type(s[7]) is str else None, None if s[8] is None else _int(s[8], "producer"),
                          s[9] is True)
        if kind == "external":
            t = tensors.get(storage.name)
            _need(t is not None, f"no tensor named {storage.name!r}")
            array = t.data
            _need(owner(array) is array and (tuple(array.shape), tuple(array.strides), array.dtype) == root
                  and extent(array)[1] == nbytes, f"{storage.name!r} changed")
            roots[i] = array
        storages.append(storage)
    values = []
    for i, v in enumerate(raw_values):
        _need(type(v) is list and len(v) == 5, "bad value")
        value = Value(i, _int(v[0], "storage", 0, len(storages)), _int(v[1], "offset"), _ints(v[2], "shape"),
                      _ints(v[3], "strides", None), _dtype(v[4]))
        _need(len(value.shape) == len(value.strides) and _inside(value, storages[value.storage].nbytes),
              "a view outside its buffer")
        values.append(value)
    objects = []
    for name in data.get("objects", []):
        _need(name == f"rng:{backend.device}", f"unknown object {name!r}")
        objects.append(default_generator(backend.device).state_object)
    nodes = []
    for n in raw_nodes:
        _need(type(n) is list and len(n) == 8 and n[1] in OPS, f"bad node {str(n)[:60]}")
        index = _int(n[0], "node index", nodes[-1].index + 1 if nodes else 0)
        args, kwargs, out = (_decode(x, len(values), len(objects)) for x in n[2:5])
        _need(type(args) is tuple and type(kwargs) is dict, "bad call")
        writes = tuple(_int(w, "writes", 0, len(storages)) for w in _ints(n[5], "writes"))
        constant = None
        if n[7] is not None:
            _need(type(n[7]) is dict and set(n[7]) == {"array"}, "bad constant")
            constant = backend.from_numpy(_decode_array(n[7]["array"]))
        _need((n[1] == "constant") == (constant is not None), "constant without data")
        nodes.append(Node(index, n[1], args, kwargs, out, writes, n[6] is True, constant))
    graph = Graph(backend.name, backend.device, storages, values, nodes, objects, list(data["objects"]),
                  [_int(v, "input", 0, len(values)) for v in _ints(data.get("inputs"), "inputs")],
                  _decode(data.get("outputs"), len(values), len(objects)))
    _need(len(graph.inputs) == len(inputs), "wrong number of inputs")
    for position, (v, a) in enumerate(zip(graph.inputs, inputs)):
        value, storage = values[v], storages[values[v].storage]
        _need(storage.kind == "input" and storage.input_index == position and value.shape == tuple(a.shape)
              and value.dtype == a.dtype and value.nbytes == storage.nbytes, "inputs do not match")
    plan = lower(graph)
    _need(json.loads(json.dumps(_lowered(plan))) == data.get("lowered"), "lowering does not match")
    return plan, roots


# ----- files -------------------------------------------------------------------------------
_reported: set[str] = set()
_report_lock = threading.Lock()


def _report(path: Path, problem: str) -> None:
    """Log a problem with a cache file once per process."""
    with _report_lock:
        if str(path) in _reported:
            return
        _reported.add(str(path))
    log.warning("compile: ignoring the cached plan %s (%s); it will be rewritten", path, problem)


def _canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


class DiskCache:
    """Plans on disk, one JSON file per (model identity, key)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def open(cls, cache_dir: Any) -> "DiskCache | None":
        """``cache_dir``: None for the default (``TENSORCORE_CACHE_DIR``), False for none."""
        if cache_dir is False:
            return None
        if cache_dir is None:
            cache_dir = settings.cache_dir()
        if not isinstance(cache_dir, str | os.PathLike):
            raise TypeError(f"compile: cache_dir must be a path, None or False, got {cache_dir!r}")
        return cls(Path(cache_dir) / "compile")

    def path(self, stable: Any, model: str) -> Path:
        name = hashlib.sha256(repr(stable).encode()).hexdigest()[:40]
        return self.root / model[:40] / f"{name}.json"

    def load(self, stable: Any, model: str, named: list, backend: Any, inputs: list[Any]
             ) -> tuple[Plan, dict[int, Any]] | None:
        path = self.path(stable, model)
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            _report(path, f"unreadable: {exc}")
            return None
        try:
            _need(len(raw) <= MAX_FILE_BYTES, "file too large")
            document = json.loads(raw)
            _need(type(document) is dict and set(document) == {"checksum", "body"}, "not a plan file")
            body = document["body"]
            _need(hashlib.sha256(_canonical(body)).hexdigest() == document["checksum"], "checksum mismatch")
            _need(type(body) is dict and body.get("format") == FORMAT, "other format")
            _need(body.get("tensorcore") == __version__ and body.get("sources") == sources_digest(),
                  "stale: made by another version of tensorcore or its kernels")
            _need(body.get("model") == model and body.get("key") == repr(stable), "made for another model or key")
            return decode(body.get("plan"), named, backend, inputs)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            _report(path, str(exc) or type(exc).__name__)
            return None

    def save(self, stable: Any, model: str, plan: Plan, named: list) -> None:
        """Write the plan atomically; plans without a plain-data form are skipped."""
        backend = backends.load(plan.graph.backend)
        try:
            body = {"format": FORMAT, "tensorcore": __version__, "sources": sources_digest(), "model": model,
                    "key": repr(stable), "plan": encode(plan, type(backend).to_numpy.__get__(backend))}
            payload = _canonical({"checksum": hashlib.sha256(_canonical(body)).hexdigest(), "body": body})
        except (NotEncodable, ValueError) as exc:
            log.debug("compile: plan kept in memory only (%s)", exc)
            return
        path = self.path(stable, model)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, payload)
        except OSError as exc:
            _report(path, f"cannot write: {exc}")
