"""The compiled callable: look a call's key up, replay its plan, or trace it.

One ``Compiled`` wraps a function or a Module.  A call computes its key (``cache.key``);
a cached plan whose guards hold is replayed; otherwise the key is traced (or its plan
loaded from the disk cache) and the traced call's own result is returned.  Keys that
cannot be compiled run eagerly: after a refused trace with ``fallback="eager"``, a
replay that failed, or traces that never settle.  Each such key warns once.

Thread safety: one lock guards the cache and the counters; each plan has its own lock,
so calls with one key replay one at a time (they share the plan's buffers) while
different keys run in parallel.  A key is traced by one thread; others arriving with
the same key meanwhile run eagerly instead of waiting.  A call made while the current
thread is tracing (a compiled function calling another) runs eagerly, so the outer
trace records it.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import operator
import threading
import time
import warnings
from itertools import chain
from typing import Any, Callable, Iterable, NamedTuple

from .. import settings, versions
from ..backends import backend_for, default_device_name
from ..random import _default, _generators
from ..tensor import Tensor, rebinds
from . import asynchronous, cache, passes as passes_module, plan as plan_module, replay, trace
from .graph import Ref, leaves, tree_map
from .trace import TraceError, owner
from .trace import _state as _TRACE_STATE

log = logging.getLogger("tensorcore.compile")

SETTLE_ATTEMPTS = 4  # unsettled traces of one key before it runs eagerly for good
FALLBACKS = ("raise", "eager")


class CompileWarning(UserWarning):
    """A key of a compiled function runs eagerly from now on (the reason is in the message)."""


class CacheInfo(NamedTuple):
    """Counters of a compiled callable (``compiled.cache_info()``).

    hits: calls answered by replaying a plan; misses: calls with no plan ready;
    traces: recorded calls (``unsettled`` of them built no plan); disk_loads: plans read
    from the disk cache; fallbacks: calls run eagerly; eager_only: keys that run
    eagerly for good; plans / max_plans: plans cached now and the bound; rewrites: what
    the graph passes did, summed over the cached traced plans (``{"lora": 1, ...}``)."""

    hits: int
    misses: int
    traces: int
    unsettled: int
    disk_loads: int
    fallbacks: int
    eager_only: int
    plans: int
    max_plans: int
    rewrites: dict[str, int]


@dataclasses.dataclass(eq=False)
class _Entry:
    """A bound plan and what a replay checks and repeats."""

    plan: plan_module.Plan
    executor: Any
    device: str
    tensors: list[Tensor]  # guarded: their .data and requires_grad must not change
    datas: list[Any]
    flags: list[bool]
    generators: list[tuple[Any, Any]]  # (Generator, the state object the plan draws from)
    source: str  # "trace" | "disk"
    written: list[versions.WriteVersion]  # of the module memory a replay writes
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.effects = tuple(self.plan.graph.effects)
        self.guards = tuple(self.plan.graph.guards)
        outputs = self.plan.graph.outputs
        self.single = type(outputs) is Ref  # the function returns one tensor
        self.flat = type(outputs) is tuple and all(type(x) is Ref for x in outputs)  # or a tuple of them
        # Tensors that announce their rebindings (parameters) are checked only when some
        # rebinding happened since the last check; the others (buffers) on every call.
        self.checked_rebinds: int | None = None
        plain = [i for i, t in enumerate(self.tensors) if not type(t).announces_rebinds]
        self.plain = ([self.tensors[i] for i in plain], [self.datas[i] for i in plain], [self.flags[i] for i in plain])

    def holds(self) -> bool:
        """Whether the program still looks as it did when the plan was made."""
        count = rebinds()
        if count != self.checked_rebinds:
            if not _bound(self.tensors, self.datas, self.flags):
                return False
            self.checked_rebinds = count
        elif self.plain[0] and not _bound(*self.plain):
            return False
        for generator, state in self.generators:
            if generator._state is not state:
                return False
        for predicate in self.guards:
            if not predicate():
                return False
        return True


def _bound(tensors: list[Tensor], datas: list[Any], flags: list[bool]) -> bool:
    """Whether each tensor still holds its storage and requires_grad flag."""
    return all(map(operator.is_, map(_DATA, tensors), datas)) and list(map(_REQUIRES_GRAD, tensors)) == flags


_DATA = Tensor.__dict__["data"].__get__  # the storage slot itself, past Parameter's property
_TRAINING = operator.attrgetter("training")
_REQUIRES_GRAD = Tensor.__dict__["requires_grad"].__get__  # the slot, past Parameter's property


class Compiled:
    """``tc.compile(fn_or_module)``: call it like the original."""

    def __init__(self, fn: Callable, *, passes: Iterable | None = None, cache_dir: Any = None,
                 max_plans: int = 16, fallback: str = "raise", reuse_outputs: bool = False) -> None:
        if not callable(fn):
            raise TypeError(f"compile: expected a function or a Module, got {type(fn).__name__}")
        if not isinstance(max_plans, int) or isinstance(max_plans, bool) or max_plans < 1:
            raise ValueError(f"compile: max_plans must be an int >= 1, got {max_plans!r}")
        if fallback not in FALLBACKS:
            raise ValueError(f"compile: fallback must be one of {FALLBACKS}, got {fallback!r}")
        self.fn = fn
        self.fallback = fallback
        self.reuse_outputs = bool(reuse_outputs)
        self.label = _label(fn)
        self._passes = passes_module.resolve(passes)
        self._sources = _root_sources(fn)
        self._namespace, self._global_names = _global_names(fn)
        # the globals' values read last time, and the modules among them by name
        self._globals_seen: tuple[tuple, list[tuple[str, Any]]] = ((), [])
        self._fn_is_module = _is_module(fn)
        self._last_seen: list[tuple[Any, bool] | None] = [None] * len(self._sources)
        self._last_spec = cache.LastSpec()
        self._disk = cache.DiskCache.open(cache_dir)
        self._lock = threading.Lock()
        self._plans: cache.LRU[_Entry] = cache.LRU(max_plans)
        self._eager_only: set[Any] = set()
        self._unsettled: dict[Any, int] = {}
        self._tracing: set[Any] = set()
        self._counts = dict.fromkeys(CacheInfo._fields[:-4], 0)
        self._modules_cache: dict[tuple[int, int], list] = {}
        self._modes_cache: dict[tuple[int, int, int], tuple[bool, ...]] = {}
        functools.update_wrapper(self, fn, updated=())

    # ----- the call ------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _TRACE_STATE.tracer is not None:  # inside another trace: run eagerly, it records
            return self.fn(*args, **kwargs)
        key, roots, tensors, stable = self._key(args, kwargs)
        with self._lock:
            entry = self._plans.get(key)
            if entry is None or not entry.holds():
                if entry is not None:
                    self._release(self._plans.pop(key))
                action = self._claim(key)
            else:
                self._counts["hits"] += 1
                action = "replay"
        if action == "replay":
            return self._replay(key, entry, tensors, args, kwargs)
        if action == "eager":
            return self.fn(*args, **kwargs)
        try:
            return self._compile(key, stable, roots, tensors, args, kwargs)
        finally:
            with self._lock:
                self._tracing.discard(key)

    def _key(self, args: tuple, kwargs: dict) -> tuple[Any, list[tuple[str, Any]], list[Tensor], Any]:
        """(key, roots, tensor arguments, the key's stable part or None) of a call; one
        without keyword arguments has its spec checked against the last call's."""
        checked = None if kwargs else self._last_spec.check(args)
        roots = self._roots(args, None if checked is None else checked[0].modules)
        key, tensors, stable = cache.key(args, kwargs, roots, self._modes, checked)
        return key, roots, tensors, stable

    def _claim(self, key: Any) -> str:
        """Under the lock, for a key without a plan: "trace" (this thread) or "eager"."""
        if key in self._eager_only:
            self._counts["fallbacks"] += 1
            return "eager"
        self._counts["misses"] += 1
        if key in self._tracing:  # another thread is tracing this key right now
            self._counts["fallbacks"] += 1
            return "eager"
        self._tracing.add(key)
        return "trace"

    def _replay(self, key: Any, entry: _Entry, tensors: list[Tensor], args: tuple, kwargs: dict) -> Any:
        with entry.lock:
            try:
                for effect in entry.effects:
                    effect()
                arrays = entry.executor.run([t.data for t in tensors], not self.reuse_outputs)
                for written in entry.written:
                    written.bump()
                for i in entry.plan.writeback:  # arguments written in place
                    versions.bump(tensors[i].data)
            except Exception as exc:  # noqa: BLE001  (any failure: the eager result is still right)
                failure = exc
            else:
                if entry.single:
                    return Tensor._wrap(arrays[0], entry.device)
                if entry.flat:
                    return tuple([Tensor._wrap(a, entry.device) for a in arrays])
                return _rebuild(entry.plan.graph.outputs, iter(arrays), entry.device)
        self._give_up(key, f"its replay failed ({type(failure).__name__}: {failure})", drop=True)
        return self.fn(*args, **kwargs)

    # ----- tracing and loading ---------------------------------------------------------
    def _compile(self, key: Any, stable: Any, roots: list, tensors: list[Tensor], args: tuple, kwargs: dict) -> Any:
        devices = {t.device for t in tensors} or {default_device_name()}
        if len(devices) > 1:
            self._give_up(key, f"its tensors are on several devices {sorted(devices)}")
            return self.fn(*args, **kwargs)
        backend = backend_for(devices.pop())
        named = self._named(roots)
        if self._disk is not None and stable is not None:
            entry = self._load(key, stable, roots, named, backend, tensors)
            if entry is not None:
                return self._replay(key, entry, tensors, args, kwargs)
        return self._trace(key, stable, roots, named, backend, tensors, args, kwargs)

    def _trace(self, key: Any, stable: Any, roots: list, named: list[tuple[str, Tensor]], backend: Any,
               tensors: list[Tensor], args: tuple, kwargs: dict) -> Any:
        copy = type(backend).copy.__get__(backend)
        inputs = [copy(t.data) for t in tensors]
        stand_ins = iter(_stand_in(buf, t) for buf, t in zip(inputs, tensors))
        call_args, call_kwargs = tree_map((args, kwargs), lambda x: next(stand_ins) if isinstance(x, Tensor) else x)
        names = {id(t.data): name for name, t in named if owner(t.data) is t.data}
        tracer = trace.Tracer(backend, inputs, names, _object_name, self.fallback, self.label)
        with trace.recording(tracer):
            out = self.fn(*call_args, **call_kwargs)
        template = None
        if tracer.failure is None:
            try:
                template = trace.output_template(tracer, out, Tensor)
            except TraceError as exc:
                if self.fallback != "eager":
                    raise
                tracer.failure = exc
        self._write_back(tracer, tensors, inputs)
        if tracer.failure is not None:
            self._give_up(key, str(tracer.failure))
            return out
        results = [copy(t.data) for t in _tensors(out)]
        device = tensors[0].device if tensors else backend.device
        del out, call_args, call_kwargs, stand_ins
        gc.collect()
        reasons = tracer.finish(template, lambda root: _describe(named, root))
        with self._lock:
            self._counts["traces"] += 1
        if reasons:
            self._unsettle(key, reasons)
        else:
            self._unsettled.pop(key, None)
            self._build(key, stable, roots, tracer, named, backend, device)
        return _rebuild(template, iter(results), device)

    def _build(self, key: Any, stable: Any, roots: list, tracer: trace.Tracer, named: list, backend: Any,
               device: str) -> None:
        graph = passes_module.run(tracer.graph, self._passes)
        plan = plan_module.lower(graph)
        if settings.debug_level >= 2:
            print(f"[tensorcore] compiled {self.label}\n{graph.table()}\n  plan: {plan.info()}")
        try:
            entry = self._entry(plan, backend, device, tracer.roots, named, "trace")
        except Exception as exc:  # noqa: BLE001
            self._give_up(key, f"its plan could not be bound ({type(exc).__name__}: {exc})")
            return
        self._store(key, entry)
        if self._disk is not None and stable is not None:
            self._disk.save(stable, self._identity(roots), plan, named)

    def _load(self, key: Any, stable: Any, roots: list, named: list, backend: Any, tensors: list[Tensor]) -> _Entry | None:
        """The key's plan from the disk cache, bound and cached, or None."""
        start = time.perf_counter()
        found = self._disk.load(stable, self._identity(roots), named, backend, [t.data for t in tensors])
        if found is None:
            return None
        plan, external_roots = found
        try:
            entry = self._entry(plan, backend, backend.device, external_roots, named, "disk")
        except Exception as exc:  # noqa: BLE001  (a plan that cannot be bound is ignored and retraced)
            log.warning("compile: ignoring a cached plan for %s that could not be bound (%s)", self.label, exc)
            return None
        with self._lock:
            self._counts["disk_loads"] += 1
        self._store(key, entry)
        log.debug("compile: %s loaded its plan from disk in %.1f ms", self.label, (time.perf_counter() - start) * 1e3)
        return entry

    def _entry(self, plan: plan_module.Plan, backend: Any, device: str, roots: dict[int, Any],
               named: list[tuple[str, Tensor]], source: str) -> _Entry:
        graph = plan.graph
        executor = replay.bind(plan, backend, roots, graph.objects)
        bound = {id(r) for r in roots.values()}
        guarded = [t for _, t in named if id(owner(t.data)) in bound]
        states = {id(g._state): g for g in list(_generators)}
        generators = [(states[id(o)], o) for o in graph.objects if id(o) in states]
        written = [versions.counter(roots[s.index]) for s in graph.storages if s.kind == "external" and s.written]
        return _Entry(plan, executor, device, guarded,
                      [t.data for t in guarded], [t.requires_grad for t in guarded], generators, source, written)

    # ----- bookkeeping ---------------------------------------------------------------------
    def _store(self, key: Any, entry: _Entry) -> None:
        with self._lock:
            evicted = self._plans.put(key, entry)
        for old in evicted:
            self._release(old)

    def _release(self, entry: _Entry | None) -> None:
        if entry is not None:
            with entry.lock:
                entry.executor.release()

    def _give_up(self, key: Any, reason: str, drop: bool = False) -> None:
        """Run ``key`` eagerly from now on, with one warning."""
        with self._lock:
            entry = self._plans.pop(key) if drop else None
            first = key not in self._eager_only
            self._eager_only.add(key)
            self._counts["fallbacks"] += 1
        self._release(entry)
        if first:
            warnings.warn(f"tc.compile: {self.label}: {reason}; this input signature runs eagerly from now on",
                          CompileWarning, stacklevel=4)

    def _unsettle(self, key: Any, reasons: list[str]) -> None:
        with self._lock:
            self._counts["unsettled"] += 1
            attempts = self._unsettled[key] = self._unsettled.get(key, 0) + 1
        log.debug("compile: %s traced again later: %s", self.label, "; ".join(reasons))
        if attempts >= SETTLE_ATTEMPTS:
            self._give_up(key, "its traces never settle: the call " + "; ".join(reasons)
                          + " (keep state that lives across calls in place, e.g. zero_grad(set_to_none=False), "
                          "or create it before compiling)")

    @staticmethod
    def _write_back(tracer: trace.Tracer, tensors: list[Tensor], inputs: list[Any]) -> None:
        for s in tracer.graph.storages:
            if s.kind == "input" and s.written:
                copy_ = type(tracer.backend).copy_
                copy_(tracer.backend, tensors[s.input_index].data, inputs[s.input_index])
                versions.bump(tensors[s.input_index].data)

    # ----- the program around the function --------------------------------------------
    def _roots(self, args: tuple = (), positions: list[int] | None = None) -> list[tuple[str, Any]]:
        """The modules the call uses, by a stable name: the compiled module itself, or
        the modules passed as arguments (at ``positions`` when known) and those the
        function's closure, ``self`` and globals refer to (read on every call: they may
        be re-bound; what each name held last time is remembered)."""
        found, seen, last = [], set(), self._last_seen
        if positions is None:
            positions = [i for i, a in enumerate(args) if cache.is_root_type(type(a))]
        for i in positions:
            a = args[i]
            if id(a) not in seen:
                seen.add(id(a))
                found.append((f"arg{i}", a))
        if self._fn_is_module:
            return found + [("", self.fn)] if id(self.fn) not in seen else found
        for i, (name, read) in enumerate(self._sources):
            try:
                value = read()
            except ValueError:  # an empty closure cell
                continue
            previous = last[i]
            if previous is None or previous[0] is not value:
                previous = last[i] = (value, _is_module(value))
            if previous[1] and id(value) not in seen:
                seen.add(id(value))
                found.append((name, value))
        if self._global_names:  # read all at once; looked at again only when one changed
            values = tuple(map(self._namespace.get, self._global_names))  # a deleted one reads as None
            before, modules = self._globals_seen
            if len(before) != len(values) or not all(map(operator.is_, values, before)):
                modules = [(name, v) for name, v in zip(self._global_names, values) if _is_module(v)]
                self._globals_seen = (values, modules)
            for name, value in modules:
                if id(value) not in seen:
                    seen.add(id(value))
                    found.append((name, value))
        return found

    def _modules(self, root: Any, version: int) -> list:
        """Every submodule of ``root`` (cached per structure version)."""
        cached_key = (id(root), version)
        modules = self._modules_cache.get(cached_key)
        if modules is None:
            if len(self._modules_cache) > 64:
                self._modules_cache.clear()
            modules = self._modules_cache[cached_key] = [m for _, m in root.named_modules()]
        return modules

    def _modes(self, root: Any, version: int) -> tuple[bool, ...]:
        """The ``training`` flags of every submodule of ``root``, read again only after a
        module's mode changed (``mode_version``) or the structure did."""
        changes = getattr(root, "mode_version", None)
        cached_key = (id(root), version, changes)
        found = self._modes_cache.get(cached_key) if changes is not None else None
        if found is None:
            found = tuple(map(_TRAINING, self._modules(root, version)))
            if changes is not None:
                if len(self._modes_cache) > 64:
                    self._modes_cache.clear()
                self._modes_cache[cached_key] = found
        return found

    def _named(self, roots: list[tuple[str, Any]]) -> list[tuple[str, Tensor]]:
        """(stable name, tensor) of every parameter and buffer of the roots."""
        named = []
        for prefix, root in roots:
            for name, t in chain(root.named_parameters(), root.named_buffers()):
                named.append((f"{prefix}.{name}" if prefix else name, t))
        return named

    def _identity(self, roots: list[tuple[str, Any]]) -> str:
        return cache.identity(self.fn, roots, passes_module.signature(self._passes))

    async def call_async(self, *args: Any, **kwargs: Any) -> Any:
        """``await compiled.call_async(...)``: the call's result, bit-identical to a plain
        call, computed off the event loop (a CUDA stream polled by event on CuPy, this
        callable's worker thread on the CPU); cancellation takes effect after the plan in
        flight (see ``asynchronous``)."""
        return await asynchronous.lane(self).run([functools.partial(self, **kwargs)], args,
                                                 asynchronous.call_device(args, kwargs))

    # ----- public ----------------------------------------------------------------------
    def cache_info(self) -> CacheInfo:
        """Counters and sizes (see ``CacheInfo``)."""
        with self._lock:
            rewrites: dict[str, int] = {}
            for entry in self._plans.values():
                for name, n in entry.plan.graph.stats.items():
                    rewrites[name] = rewrites.get(name, 0) + n
            return CacheInfo(**self._counts, eager_only=len(self._eager_only), plans=len(self._plans),
                             max_plans=self._plans.capacity, rewrites=rewrites)

    def plan_info(self) -> list[dict]:
        """One dict per cached plan: steps, the arena against the sum of the intermediates
        (bytes), where the plan came from, and the graph as a table."""
        with self._lock:
            entries = list(self._plans.values())
        out = []
        for entry in entries:
            info = entry.plan.info()
            info["arena_bytes"] = getattr(entry.executor, "arena_bytes", info["arena_bytes"])
            info.update(source=entry.source, device=entry.device, graph=entry.plan.graph.table())
            out.append(info)
        return out

    def release(self) -> None:
        """Free every plan (buffers, CUDA graphs); the next call traces or loads again."""
        with self._lock:
            entries = list(self._plans.values())
            self._plans.clear()
            self._unsettled.clear()
        for entry in entries:
            self._release(entry)

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        """``@tc.compile`` on a method: bound to the instance (a module instance is a root)."""
        return self if obj is None else functools.partial(self, obj)

    def __repr__(self) -> str:
        return f"tc.compile({self.label})"


# ----- helpers ---------------------------------------------------------------------------
def _is_module(obj: Any) -> bool:
    return hasattr(type(obj), "structure_version") and hasattr(obj, "named_parameters")


def _label(fn: Any) -> str:
    if _is_module(fn):
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _root_sources(fn: Any) -> list[tuple[str, Callable[[], Any]]]:
    """Where a function's modules are found besides its globals, as (name, reader)
    pairs read on every call (closure cells may be re-bound); none for a module."""
    if _is_module(fn):
        return []
    sources: list[tuple[str, Callable[[], Any]]] = []
    bound_self = getattr(fn, "__self__", None)
    if bound_self is not None:
        sources.append(("self", lambda: bound_self))
    func = getattr(fn, "__func__", fn)
    code = getattr(func, "__code__", None)
    if code is None:
        return sources
    for name, cell in zip(code.co_freevars, func.__closure__ or ()):
        sources.append((name, lambda cell=cell: cell.cell_contents))
    return sources


def _global_names(fn: Any) -> tuple[dict, tuple[str, ...]]:
    """(the function's global namespace, the names its code reads): those that hold a
    module are roots, read on every call since a global may be re-bound.  Attribute
    names are among them; they read as None."""
    func = getattr(fn, "__func__", fn)
    code = getattr(func, "__code__", None)
    if _is_module(fn) or code is None:
        return {}, ()
    return getattr(func, "__globals__", {}), tuple(dict.fromkeys(_code_names(code)))


def _code_names(code: Any) -> Iterable[str]:
    yield from code.co_names
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            yield from _code_names(const)


def _stand_in(buf: Any, t: Tensor) -> Tensor:
    """The traced call's copy of an input tensor (same device and requires_grad)."""
    stand_in = Tensor._wrap(buf, t.device)
    stand_in.requires_grad = t.requires_grad
    return stand_in


def _tensors(tree: Any) -> list[Tensor]:
    return [x for x in leaves(tree) if isinstance(x, Tensor)]


def _rebuild(template: Any, arrays: Any, device: str) -> Any:
    """The returned structure with each Ref replaced by a tensor of the next array."""
    return tree_map(template, lambda x: Tensor._wrap(next(arrays), device) if type(x) is Ref else x)


def _object_name(obj: Any) -> str | None:
    """A stable name for a default generator's state (the disk cache binds it by name)."""
    for device, generator in list(_default.items()):
        if generator._state is obj:
            return f"rng:{device}"
    return None


def _describe(named: list[tuple[str, Tensor]], root: Any) -> str | None:
    """Which parameter's data or gradient holds ``root``, if any."""
    for name, t in named:
        if owner(t.data) is root:
            return f"the data of '{name}'"
        if t.grad is not None and owner(t.grad.data) is root:
            return f"the gradient of '{name}'"
    return None
