"""Tracing: run a call for real while recording every backend call it makes.

Every op -- forward, backward, optimizer update, random draw -- reaches the device
through a method of the backend object, so recording happens there: while a trace is
active, each loaded backend's public methods are shadowed on the instance by wrappers
that append a ``Node`` to the tracing thread's ``Tracer`` (other threads pass straight
through, and so do the calls a backend method makes to its own methods).  The call's
result is computed as in eager mode, so the traced call returns the right answer.

What a trace must not do, and what happens instead:

* read a value to the host (``.item()``, ``.numpy()``, ``bool(t)``, ``float(t)``,
  ``numpy.asarray(t)``, moving a tensor to another device) -- a plan cannot depend on
  data.  Reading a value computed from constants alone is fine.  Otherwise
  ``TraceError`` names the op, or with ``fallback="eager"`` the recording stops, the
  call finishes eagerly and the caller marks the key eager-only;
* use two backends, or touch ``backend.xp`` directly (not recorded) -- the same error.

After the call, ``Tracer.finish`` checks that the recording describes a repeatable
program: every memory block the call read that existed before it must still be held
by the program (a block the call replaced, e.g. a parameter re-bound by an optimizer's
first step, would be stale), no block the call allocated may be kept after it (the
call created state, e.g. a lazily built cache), and no random generator may have been
created or reseeded in it (a replay would not reseed).  Any of these makes the trace
*unsettled*:
its result is right, but the plan is not built and the next call traces again.

Host-side effects a replay must repeat (an optimizer's host step counters) register
with ``tracing.host_effect``, and host-side decisions that may change (an optimizer's
first step) with ``tracing.guard``: the ``Tracer`` is the leaf module's ``Recorder``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .. import backends, versions
from ..backends.geometry import address, extent
from ..tracing import state as _state
from .graph import Graph, Node, Obj, Ref, Storage, Value, leaves, refs, tree_map


class TraceError(RuntimeError):
    """A traced function did something a compiled plan cannot repeat."""


CAPTURES = frozenset({"array", "from_numpy"})  # host data in: captured by value when it is host data
RANDOM = frozenset({"uniform", "normal", "integers"})  # advance a generator
EFFECTS = RANDOM | {"collective_"}  # effects beyond their arrays (other processes take part): never removed
WRITTEN_ARGS = {"copy_": (0,), "add_": (0,), "setitem_": (0,), "index_add_": (0,), "batch_norm": (3, 4),
                "collective_": (0,)}


# ----- recording wrappers on the backend instances ------------------------------------
class _XpGuard:
    """Stands in for ``backend.xp`` while tracing: arrays touched through the array
    module directly would not be recorded, so outside backend methods it refuses."""

    def __init__(self, xp: Any) -> None:
        object.__setattr__(self, "_xp", xp)

    def __getattr__(self, name: str) -> Any:
        tracer = _state.recorder
        if tracer is not None and not tracer.depth:
            tracer.fail(f"backend.xp.{name} (array-module calls outside backend methods are not recorded; "
                        "use the backend's methods)")
        return getattr(self._xp, name)


def _method_names(cls: type) -> tuple[str, ...]:
    return tuple(name for name in dir(cls) if not name.startswith("_") and name != "xp"
                 and callable(getattr(cls, name)) and not isinstance(getattr(cls, name), type))


def _recorder(backend: Any, name: str, method: Callable) -> Callable:
    def recorded(*args: Any, **kwargs: Any) -> Any:
        tracer = _state.recorder
        if tracer is None or tracer.depth:
            return method(*args, **kwargs)
        return tracer.record(backend, name, method, args, kwargs)

    recorded.__name__ = name
    recorded.__wrapped__ = method  # type: ignore[attr-defined]
    return recorded


_install_lock = threading.Lock()
_installed: dict[int, list] = {}  # id(backend) -> [backend, count]


def _install(backend: Any) -> None:
    with _install_lock:
        entry = _installed.setdefault(id(backend), [backend, 0])
        entry[1] += 1
        if entry[1] > 1:
            return
        cls = type(backend)
        for name in _method_names(cls):
            setattr(backend, name, _recorder(backend, name, getattr(cls, name).__get__(backend)))
        backend.xp = _XpGuard(cls.xp)


def _uninstall(backend: Any) -> None:
    with _install_lock:
        entry = _installed[id(backend)]
        entry[1] -= 1
        if entry[1]:
            return
        del _installed[id(backend)]
        for name in (*_method_names(type(backend)), "xp"):
            backend.__dict__.pop(name, None)


@contextlib.contextmanager
def recording(tracer: "Tracer") -> Iterator[None]:
    """Record this thread's backend calls into ``tracer`` inside the block."""
    loaded = backends.loaded()
    for backend in loaded:
        _install(backend)
    _state.recorder = tracer
    try:
        yield
    finally:
        _state.recorder = None
        for backend in loaded:
            _uninstall(backend)


# ----- the tracer ----------------------------------------------------------------------
_TENSOR_FILE = str(Path(__file__).resolve().parent.parent / "tensor.py")
_MOVEMENT_FILE = str(Path(__file__).resolve().parent.parent / "ops" / "movement.py")
_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)
_READS = {
    "numpy": "Tensor.numpy()", "item": "Tensor.item()", "tolist": "Tensor.tolist()",
    "__bool__": "bool(tensor) (data-dependent control flow)", "__float__": "float(tensor)",
    "__int__": "int(tensor)", "__index__": "using a tensor as an index", "__array__": "numpy.asarray(tensor)",
    "__repr__": "repr(tensor)", "to": "Tensor.to(device)",
}


class Tracer:
    """Records one call: the graph, plus the live objects it binds (``roots``)."""

    def __init__(self, backend: Any, inputs: list[Any], names: dict[int, str],
                 object_names: Callable[[Any], str | None], fallback: str, label: str) -> None:
        self.backend = backend
        self.types = (type(backend.__class__.empty(backend, (0,), np.float32)),)
        self.graph = Graph(backend.name, backend.device)
        self.names = names  # id(root array) -> stable name
        self.object_names = object_names
        self.fallback = fallback
        self.label = label
        self.depth = 0
        self.failure: TraceError | None = None
        self.seeded = False  # a random generator was created or reseeded during the call
        self.inputs = inputs  # owned: kept alive by the tracer
        self.roots: dict[int, Any] = {}  # external storage -> its root array (after finish)
        self._by_id: dict[int, int] = {}  # id(array) -> value
        self._by_root: dict[int, int] = {}  # id(root array) -> storage
        self._views: dict[tuple, int] = {}
        self._low: list[int] = []  # lowest address of each storage
        self._watch: list[Any] = []  # weak reference to each storage's root
        self._weak: list[weakref.ref] = []
        self._pure: set[int] = set()  # storages computed from constants only
        for i, buf in enumerate(inputs):
            storage = self._storage("input", buf, input_index=i)
            self.graph.inputs.append(self._value(storage, buf))

    # ----- storages and values ---------------------------------------------------------
    def _storage(self, kind: str, root: Any, **fields: Any) -> int:
        low, nbytes = extent(root)
        index = len(self.graph.storages)
        self.graph.storages.append(Storage(index, kind, nbytes, address(root) - low,
                                           (tuple(root.shape), tuple(root.strides), root.dtype), **fields))
        self._low.append(low)
        key = id(root)
        self._by_root[key] = index
        self._watch.append(weakref.ref(root, lambda _, k=key: self._by_root.pop(k, None)))
        return index

    def _value(self, storage: int, a: Any) -> int:
        key = (storage, address(a) - self._low[storage], tuple(a.shape), tuple(a.strides), a.dtype)
        index = self._views.get(key)
        if index is None:
            index = len(self.graph.values)
            self.graph.values.append(Value(index, *key))
            self._views[key] = index
        ident = id(a)
        self._by_id[ident] = index
        self._weak.append(weakref.ref(a, lambda _, k=ident: self._by_id.pop(k, None)))
        return index

    def _known(self, a: Any) -> int | None:
        """The value of a known array (or a view of known memory), else None."""
        index = self._by_id.get(id(a))
        if index is not None:
            return index
        storage = self._by_root.get(id(versions.storage(a)))
        return None if storage is None else self._value(storage, a)

    def _argument(self, a: Any) -> int:
        index = self._known(a)
        if index is not None:
            return index
        root = versions.storage(a)  # memory from before the call (or made outside any backend call)
        return self._value(self._storage("external", root, name=self.names.get(id(root))), a)

    def _template(self, obj: Any) -> Any:
        return tree_map(obj, self._leaf)

    def _leaf(self, obj: Any) -> Any:
        kind = type(obj)
        if kind in self.types:
            return Ref(self._argument(obj))
        if kind is np.ndarray:  # host data handed to a GPU kernel: a constant
            return obj.copy()
        if obj is None or kind in (bool, int, float, str, slice, type(Ellipsis)) or isinstance(obj, np.generic | np.dtype | type):
            return obj
        for i, known in enumerate(self.graph.objects):
            if known is obj:
                return Obj(i)
        self.graph.objects.append(obj)
        self.graph.object_names.append(self.object_names(obj))
        return Obj(len(self.graph.objects) - 1)

    def _mentions_known(self, obj: Any) -> bool:
        """Whether ``obj`` holds an array the trace knows (host data holds none)."""
        return any(type(a) in self.types and self._known(a) is not None for a in leaves(obj))

    def _result(self, r: Any, node: int, pure: bool) -> Any:
        kind = type(r)
        if kind in self.types:
            index = self._known(r)
            if index is None:
                storage = self._storage("fresh", versions.storage(r), producer=node)
                if pure:
                    self._pure.add(storage)
                index = self._value(storage, r)
            return Ref(index)
        if kind is tuple:
            return tuple(self._result(x, node, pure) for x in r)
        return r

    # ----- recording -------------------------------------------------------------------
    def record(self, backend: Any, name: str, method: Callable, args: tuple, kwargs: dict) -> Any:
        """Run ``method`` and append the call to the graph."""
        if backend is not self.backend:
            self.fail(f"{name} on the {backend.name} backend (the call already uses {self.backend.name})")
            return method(*args, **kwargs)
        if name == "to_numpy":
            return self._host_read(method, args, kwargs)
        if name == "rng":  # a generator made or reseeded in the call: new state, settled by a retrace
            self.seeded = True
            self.depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                self.depth -= 1
        captured = name in CAPTURES and not self._mentions_known((args, kwargs))
        arg_t, kw_t = ((), {}) if captured else (self._template(args), self._template(kwargs))
        self.depth += 1
        try:
            result = method(*args, **kwargs)
        finally:
            self.depth -= 1
        if self.failure is not None or _state.recorder is not self:
            return result
        result = self._scalars_as_arrays(result)
        index = len(self.graph.nodes)
        if captured:
            return self._constant(result, index)
        objects = any(isinstance(x, Obj) for x in leaves((arg_t, kw_t)))
        writes = self._writes(name, arg_t, kw_t)
        inputs = {self.graph.values[r.value].storage for r in refs((arg_t, kw_t))}
        pure = not writes and name not in EFFECTS and not objects and inputs <= self._pure
        out = self._result(result, index, pure)
        for s in writes:
            self.graph.storages[s].written = True
            self._pure.discard(s)
        self.graph.nodes.append(Node(index, name, arg_t, kw_t, out, tuple(sorted(writes)), name in EFFECTS))
        return result

    def _constant(self, result: Any, index: int) -> Any:
        """Host data copied in: a ``constant`` node holding a snapshot of it."""
        root = versions.storage(result)
        storage = self._by_root.get(id(root))
        if storage is None:
            storage = self._storage("data", root, producer=index)
        self._pure.add(storage)
        snapshot = type(self.backend).copy(self.backend, result)
        out = Ref(self._value(storage, result))
        self.graph.nodes.append(Node(index, "constant", (), {}, out, (), False, snapshot))
        return result

    def _scalars_as_arrays(self, result: Any) -> Any:
        """NumPy reductions may return scalars: make them 0-d arrays so they are tracked
        (``Tensor`` does the same when it wraps them)."""
        if isinstance(result, np.generic) and self.types[0] is np.ndarray:
            return np.asarray(result)
        if type(result) is tuple:
            return tuple(self._scalars_as_arrays(r) for r in result)
        return result

    def _writes(self, name: str, arg_t: tuple, kw_t: dict) -> set[int]:
        if name in WRITTEN_ARGS:
            written = [arg_t[i] for i in WRITTEN_ARGS[name] if i < len(arg_t)]
        elif name.endswith("_"):
            written = list(arg_t)
        else:
            written = []
        if "out" in kw_t:
            written.append(kw_t["out"])
        return {self.graph.values[r.value].storage for r in refs(written)}

    def _host_read(self, method: Callable, args: tuple, kwargs: dict) -> Any:
        a = args[0] if args else None
        index = self._known(a) if type(a) in self.types else None
        if index is None or self.graph.values[index].storage not in self._pure:
            self.fail(_describe_read())
        return method(*args, **kwargs)

    def fail(self, what: str) -> None:
        """Refuse ``what``: raise TraceError, or (fallback="eager") stop recording and
        let the call finish eagerly."""
        error = TraceError(f"tc.compile: {what} while tracing {self.label}{_caller()}: a compiled plan "
                           "cannot depend on tensor values or host-side state. Keep host reads and "
                           "data-dependent control flow out of the compiled function, or pass fallback='eager'.")
        if self.fallback != "eager":
            raise error
        self.failure = error
        _state.recorder = None

    # ----- the Recorder protocol (tensorcore.tracing) --------------------------------------
    def add_effect(self, effect: Callable[[], None]) -> None:
        """Run ``effect`` with its backend calls unrecorded; replays repeat it."""
        self.depth += 1
        try:
            effect()
        finally:
            self.depth -= 1
        self.graph.effects.append(effect)

    def add_guard(self, predicate: Callable[[], bool]) -> None:
        self.graph.guards.append(predicate)

    # ----- after the call --------------------------------------------------------------
    def finish(self, outputs: Any, describe: Callable[[Any], str | None]) -> list[str]:
        """Freeze the graph; return the reasons the trace is unsettled (empty if none).

        Call after the traced function's results have been copied and dropped and the
        garbage collected, so liveness reflects what the program still holds."""
        self.graph.outputs = outputs
        reasons = ["seeded a random generator"] if self.seeded else []
        for s, watch in zip(self.graph.storages, self._watch):
            root = watch()
            if s.kind == "external":
                if root is None:
                    reasons.append(f"{s.name or 'a buffer'} it read was replaced during the call")
                else:
                    self.roots[s.index] = root
            elif s.kind == "fresh" or (s.kind == "data" and s.written):
                if root is not None:
                    reasons.append(f"{describe(root) or 'a tensor'} it created is still held after the call")
        return reasons


def output_template(tracer: Tracer, tree: Any, tensor_type: type) -> Any:
    """The returned structure with each Tensor replaced by a Ref to its array."""
    def leaf(x: Any) -> Any:
        if isinstance(x, tensor_type):
            return Ref(tracer._argument(x.data))
        if x is None or type(x) in (bool, int, float, str):
            return x
        raise TraceError(f"tc.compile: {tracer.label} returned a {type(x).__name__}; a compiled function may "
                         "return Tensors, Python scalars and strings, None, and tuples, lists and dicts of them")
    return tree_map(tree, leaf)


def _describe_read() -> str:
    """The outermost Tensor method on the stack that led to the host read (or the
    function that called ``to_numpy`` itself)."""
    frame, found = sys._getframe(2), None
    while frame is not None:
        if frame.f_code.co_filename == _TENSOR_FILE:
            found = frame.f_code.co_name
        elif found is not None:
            break
        frame = frame.f_back
    if found is not None:
        return _READS.get(found, f"Tensor.{found}()") + " (reads a value to the host)"
    caller = sys._getframe(2)
    while caller.f_code.co_filename == __file__:  # past the tracer and the recording wrapper
        caller = caller.f_back
    caller = caller.f_code
    if caller.co_filename == _MOVEMENT_FILE:
        return "moving a tensor to another device (a host round trip)"
    return f"backend.to_numpy in {caller.co_name}() (reads a value to the host)"


def _caller() -> str:
    """' (at file:line)' of the innermost frame outside tensorcore."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    return "" if frame is None else f" (at {frame.f_code.co_filename}:{frame.f_lineno})"
