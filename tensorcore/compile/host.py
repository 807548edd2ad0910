"""The compiled callable: look a call's key up, replay its plan, or trace it.

One ``Compiled`` wraps a function or a Module.  A call computes its key (``key.call_key``);
a cached plan whose guards hold is replayed; otherwise the key is traced (or its plan
loaded from the disk cache) and the traced call's own result is returned.  Keys that
cannot be compiled run eagerly: after a refused trace with ``fallback="eager"``, a
replay that failed, or traces that never settle.  Each such key warns once.

Thread safety: one lock guards the cache and the counters; each plan has its own lock,
so calls with one key replay one at a time (they share the plan's buffers) while
different keys run in parallel.  A call that finds a plan holds a lease on it until it
returns: a plan evicted from the cache, dropped or ``release()``d meanwhile is retired,
and its memory freed only when the last call replaying it has returned.  A key is traced by one thread; others arriving with
the same key meanwhile run eagerly instead of waiting.  A call made while the current
thread is tracing (a compiled function calling another) runs eagerly, so the outer
trace records it.
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
import time
import warnings
from typing import Any, Callable, Iterable, NamedTuple

from .. import random, settings, tracing, versions
from ..backends import backend_for, default_device_name
from ..tensor import Tensor
from . import asynchronous, passes as passes_module, plan as plan_module, trace
from .disk import DiskCache
from .entry import Entry, bind, retired
from .graph import Ref, leaves, tree_map
from .identity import identity
from .key import LastSpec, call_key, describe
from .lru import LRU
from .roots import Roots, label
from .trace import TraceError

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
        self.label = label(fn)
        self._passes = passes_module.resolve(passes)
        self._roots = Roots(fn)
        self._last_spec = LastSpec()
        self._disk = DiskCache.open(cache_dir)
        self._lock = threading.Lock()
        self._plans: LRU[Entry] = LRU(max_plans)
        self._eager_only: set[Any] = set()
        self._unsettled: dict[Any, int] = {}
        self._tracing: set[Any] = set()
        self._counts = dict.fromkeys(CacheInfo._fields[:-4], 0)
        functools.update_wrapper(self, fn, updated=())

    # ----- the call ------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if tracing.state.recorder is not None:  # inside another trace: run eagerly, it records
            return self.fn(*args, **kwargs)
        key, roots, tensors, stable = self._key(args, kwargs)
        stale = None
        with self._lock:
            entry = self._plans.get(key)
            if entry is None or not entry.holds():
                if entry is not None:
                    stale = retired(self._plans.pop(key))
                action = self._claim(key)
            else:
                self._counts["hits"] += 1
                entry.lease()
                action = "replay"
        _free(stale)
        if action == "replay":
            return self._replay_leased(key, entry, tensors, args, kwargs)
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
        roots = self._roots.of_call(args, None if checked is None else checked[0].modules)
        key, tensors, stable = call_key(args, kwargs, roots, self._roots.modes, checked)
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

    def _replay_leased(self, key: Any, entry: Entry, tensors: list[Tensor], args: tuple, kwargs: dict) -> Any:
        """Replay ``entry``, on which the caller holds a lease, and give the lease back."""
        try:
            return self._replay(key, entry, tensors, args, kwargs)
        finally:
            with self._lock:
                last = entry.give_back()
            if last:
                entry.free()

    def _replay(self, key: Any, entry: Entry, tensors: list[Tensor], args: tuple, kwargs: dict) -> Any:
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
        self._give_up(key, f"its replay failed ({type(failure).__name__}: {failure})", drop=entry)
        return self.fn(*args, **kwargs)

    # ----- tracing and loading ---------------------------------------------------------
    def _compile(self, key: Any, stable: Any, roots: list, tensors: list[Tensor], args: tuple, kwargs: dict) -> Any:
        devices = {t.device for t in tensors} or {default_device_name()}
        if len(devices) > 1:
            self._give_up(key, f"its tensors are on several devices {sorted(devices)}")
            return self.fn(*args, **kwargs)
        backend = backend_for(devices.pop())
        if backend.kernels_pending():  # a plan bound now would keep the slower stand-ins: later
            with self._lock:
                self._counts["fallbacks"] += 1
            return self.fn(*args, **kwargs)
        named = Roots.named(roots)
        if self._disk is not None and stable is not None:
            entry = self._load(key, stable, roots, named, backend, tensors)
            if entry is not None:
                return self._replay_leased(key, entry, tensors, args, kwargs)
        return self._trace(key, stable, roots, named, backend, tensors, args, kwargs)

    def _trace(self, key: Any, stable: Any, roots: list, named: list[tuple[str, Tensor]], backend: Any,
               tensors: list[Tensor], args: tuple, kwargs: dict) -> Any:
        copy = type(backend).copy.__get__(backend)
        inputs = [copy(t.data) for t in tensors]
        stand_ins = iter(_stand_in(buf, t) for buf, t in zip(inputs, tensors))
        call_args, call_kwargs = tree_map((args, kwargs), lambda x: next(stand_ins) if isinstance(x, Tensor) else x)
        names = {id(t.data): name for name, t in named if versions.storage(t.data) is t.data}
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
            print(f"[tensorcore] compiled {self.label} for {describe(key)}\n{graph.table()}\n  plan: {plan.info()}")
        try:
            entry = bind(plan, backend, device, tracer.roots, named, "trace")
        except Exception as exc:  # noqa: BLE001
            self._give_up(key, f"its plan could not be bound ({type(exc).__name__}: {exc})")
            return
        self._store(key, entry)
        if self._disk is not None and stable is not None:
            self._disk.save(stable, self._identity(roots), plan, named)

    def _load(self, key: Any, stable: Any, roots: list, named: list, backend: Any, tensors: list[Tensor]) -> Entry | None:
        """The key's plan from the disk cache, bound, cached and leased to the caller, or None."""
        start = time.perf_counter()
        found = self._disk.load(stable, self._identity(roots), named, backend, [t.data for t in tensors])
        if found is None:
            return None
        plan, external_roots = found
        try:
            entry = bind(plan, backend, backend.device, external_roots, named, "disk")
        except Exception as exc:  # noqa: BLE001  (a plan that cannot be bound is ignored and retraced)
            log.warning("compile: ignoring a cached plan for %s that could not be bound (%s)", self.label, exc)
            return None
        with self._lock:
            self._counts["disk_loads"] += 1
        self._store(key, entry, lease=True)
        log.debug("compile: %s loaded its plan from disk in %.1f ms", self.label, (time.perf_counter() - start) * 1e3)
        return entry

    # ----- bookkeeping ---------------------------------------------------------------------
    def _store(self, key: Any, entry: Entry, lease: bool = False) -> None:
        """Cache ``entry`` (leased to the caller when ``lease``); retire what it pushes out."""
        with self._lock:
            if lease:
                entry.lease()
            freed = [retired(old) for old in self._plans.put(key, entry)]
        for old in freed:
            _free(old)

    def _give_up(self, key: Any, reason: str, drop: Entry | None = None) -> None:
        """Run ``key`` eagerly from now on, with one warning; ``drop``: its failed plan,
        taken out of the cache (unless another has replaced it)."""
        with self._lock:
            freed = None
            if drop is not None and self._plans.peek(key) is drop:
                freed = retired(self._plans.pop(key))
            first = key not in self._eager_only
            self._eager_only.add(key)
            self._counts["fallbacks"] += 1
        _free(freed)
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

    def _identity(self, roots: list[tuple[str, Any]]) -> str:
        return identity(self.fn, roots, passes_module.signature(self._passes))

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
        (bytes), where the plan came from, its key and its graph as text."""
        with self._lock:
            entries = self._plans.items()
        out = []
        for key, entry in entries:
            info = entry.plan.info()
            info["arena_bytes"] = getattr(entry.executor, "arena_bytes", info["arena_bytes"])
            info.update(source=entry.source, device=entry.device, key=describe(key), graph=entry.plan.graph.table())
            out.append(info)
        return out

    def release(self) -> None:
        """Free every plan (buffers, CUDA graphs); the next call traces or loads again."""
        with self._lock:
            freed = [retired(entry) for entry in self._plans.values()]
            self._plans.clear()
            self._unsettled.clear()
        for entry in freed:
            _free(entry)

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        """``@tc.compile`` on a method: bound to the instance (a module instance is a root)."""
        return self if obj is None else functools.partial(self, obj)

    def __repr__(self) -> str:
        return f"tc.compile({self.label})"


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
    for device, generator in random.default_generators().items():
        if generator.state_object is obj:
            return f"rng:{device}"
    return None


def _free(entry: Entry | None) -> None:
    if entry is not None:
        entry.free()


def _describe(named: list[tuple[str, Tensor]], root: Any) -> str | None:
    """Which parameter's data or gradient holds ``root``, if any."""
    for name, t in named:
        if versions.storage(t.data) is root:
            return f"the data of '{name}'"
        if t.grad is not None and versions.storage(t.grad.data) is root:
            return f"the gradient of '{name}'"
    return None
