"""A cached plan bound to memory: what a replay checks first, and the lease that keeps
it alive while calls replay it.

An ``Entry`` holds a plan's executor and what the plan assumed of the program (which
arrays its parameters and buffers hold, their requires_grad flags, the random
generators' states, the host-side guards).  A call that finds the entry leases it;
an entry taken out of the cache (evicted, dropped or released) is *retired*, and its
executor is freed by whoever sees it retired with no holder left -- the evicting
thread, or the last replaying call when it returns -- so a replay never runs on freed
memory.  ``lock`` lets one replay at a time use the plan's buffers.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from typing import Any

from .. import random, versions
from ..tensor import Tensor, rebinds
from .graph import Ref
from .plan import Plan


@dataclasses.dataclass(eq=False)
class Entry:
    """A bound plan and what a replay checks and repeats."""

    plan: Plan
    executor: Any
    device: str
    tensors: list[Tensor]  # guarded: their .data and requires_grad must not change
    datas: list[Any]
    flags: list[bool]
    generators: list[tuple[Any, Any]]  # (Generator, the state object the plan draws from)
    source: str  # "trace" | "disk"
    written: list[versions.WriteVersion]  # of the module memory a replay writes
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # one replay at a time
    holders: int = 0  # calls replaying it now (their leases)
    retired: bool = False  # out of the cache: freed when the last holder returns

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
            if generator.state_object is not state:
                return False
        for predicate in self.guards:
            if not predicate():
                return False
        return True

    # ----- the lease (every method below is called under the owning cache's lock) ---------
    def lease(self) -> None:
        """A call found the entry and will replay it."""
        self.holders += 1

    def give_back(self) -> bool:
        """A replaying call returned; True when it was the last one of a retired entry
        (the caller frees it after the lock)."""
        self.holders -= 1
        return self.retired and not self.holders

    def retire(self) -> bool:
        """The entry left the cache; True when nobody replays it (free it after the lock)."""
        self.retired = True
        return not self.holders

    def free(self) -> None:
        """Free the executor's memory, after any replay in progress (outside the cache's lock)."""
        with self.lock:
            self.executor.release()


def _bound(tensors: list[Tensor], datas: list[Any], flags: list[bool]) -> bool:
    """Whether each tensor still holds its storage and requires_grad flag."""
    return all(map(operator.is_, map(_DATA, tensors), datas)) and list(map(_REQUIRES_GRAD, tensors)) == flags


_DATA = Tensor.__dict__["data"].__get__  # the storage slot itself, past Parameter's property
_REQUIRES_GRAD = Tensor.__dict__["requires_grad"].__get__  # the slot, past Parameter's property


def bind(plan: Plan, backend: Any, device: str, roots: dict[int, Any], named: list[tuple[str, Tensor]],
         source: str) -> Entry:
    """``plan`` bound to memory by ``backend``'s executor, with the parameters, buffers
    and random generators it binds (a replay checks they are still in place)."""
    graph = plan.graph
    executor = type(backend).executor(backend, plan, roots, graph.objects)  # past any tracing wrapper
    bound = {id(r) for r in roots.values()}
    guarded = [t for _, t in named if id(versions.storage(t.data)) in bound]
    states = {id(g.state_object): g for g in random.live_generators()}
    generators = [(states[id(o)], o) for o in graph.objects if id(o) in states]
    written = [versions.counter(roots[s.index]) for s in graph.storages if s.kind == "external" and s.written]
    return Entry(plan, executor, device, guarded,
                 [t.data for t in guarded], [t.requires_grad for t in guarded], generators, source, written)


def retired(entry: Entry | None) -> Entry | None:
    """Retire an entry taken out of the cache (under its lock): the entry when it is to
    be freed now, after the lock, else None (its last holder frees it)."""
    return entry if entry is not None and entry.retire() else None
