"""A call's cache key: what a compiled plan depends on, as a hashable value.

A key holds each tensor argument's shape, dtype, device and requires_grad, every other
argument by value (static arguments), which tensor arguments are the same tensor, grad
mode, the matmul precision, the backend serving the CPU and the default device, each
module's ``training`` flags and its ``structure_version`` (replacing a parameter,
adding a layer, a LoRA merge or a VAE tiling flip changes it; new parameter *values* do
not).  ``call_key`` also returns the *stable* part -- everything but the structure versions,
which are counters of this process -- that names the plan on disk, or None when an
argument cannot be named across processes (a module or an arbitrary object passed as
an argument).  ``describe`` prints a key for people.

Keys are plain nested tuples (hashed and compared at C speed on every call);
``LastSpec`` spares a loop rebuilding the spec of arguments that did not change.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .. import autograd, backends, settings
from ..tensor import Tensor


def call_key(args: tuple, kwargs: dict, roots: list[tuple[str, Any]], modes_of: Any,
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


def describe(key: Any) -> str:
    """A key as text for people: the arguments (``f32[3, 4] cpu``, static values), the
    grad mode, precision, backend and device, the modules' modes and structure versions."""
    (spec, alias, state, trainings), versions = key
    positional, keywords = spec
    parts = [_describe_spec(item) for item in positional[1:]]
    parts += [f"{name}={_describe_spec(item)}" for name, item in keywords[1:]]
    grad, precision, cpu_backend, device = state
    lines = [f"call({', '.join(parts)})",
             f"grad={'on' if grad else 'off'} precision={precision} cpu backend={cpu_backend} default device={device}"]
    if alias:
        lines.append(f"same tensor at argument positions {list(alias)}")
    for i, (modes, version) in enumerate(zip(trainings, versions)):
        lines.append(f"module {i}: structure version {version}, training={''.join('TF'[not m] for m in modes)}")
    return "\n".join(lines)


def _describe_spec(item: tuple) -> str:
    kind = item[0]
    if kind == "T":
        shape, dtype, device, requires_grad = item[1:]
        return f"{dtype}{list(shape)} {device}" + (" requires_grad" if requires_grad else "")
    if kind in ("tuple", "list"):
        inner = ", ".join(_describe_spec(x) for x in item[1:])
        return f"({inner})" if kind == "tuple" else f"[{inner}]"
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {_describe_spec(v)}" for k, v in item[1:]) + "}"
    if kind == "module":
        return "<module>"
    return repr(item[-1])
