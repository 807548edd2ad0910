"""The CPU executor of compiled plans (NumPy and Numba backends): ``NumpyBackend.executor``.

``CpuReplay`` binds everything once: one allocation holds
the input buffers, the constants and the arena; every array a step touches -- inputs,
intermediates, views of either, the program's external buffers -- is built once from
its storage's address and its recorded geometry, so each step is a pre-bound call.  A
step is, in order of preference: the backend's ``prepare``d form of the call (the
kernel itself bound to its arrays, checks done once -- NumPy's ufuncs and matmul
writing into the arena, the Numba activation kernels), the method called with
``out=`` where it takes one (where, clip, concatenate, the Numba convolutions; for a
tuple result a tuple of the items' buffers: the Numba norms and attention), or the
method called as in eager mode with its result copied into the arena.  The first two
allocate nothing for the NumPy primitives; kernels that allocate their results still
do, and the copy puts the result in its planned buffer.  Replay is a loop over those
calls.

It takes the external buffers as live root arrays (``roots``, by storage) and the
opaque objects (random generators) by position, so a plan loaded from disk binds the
same way as a freshly traced one.  The plan is read through its own methods and fields
(``Plan`` in ``tensorcore/compile/plan.py``); nothing here imports the compiler.

A backend that can run steps as native code (Numba: ``native`` gives a bound step's
jitted form, ``link`` turns runs of those into one jitted call each, see
``numba/native_plan.py``) gets every step with its native form, and installs the calls
the replay loops over -- at once, or the Python steps first and the native ones once
they are compiled (``python_steps`` stay the one call per plan step).
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Callable

import numpy as np

from ..geometry import address


@functools.lru_cache(maxsize=None)
def _accepts_out(cls: type, name: str) -> bool:
    try:
        return "out" in inspect.signature(getattr(cls, name)).parameters
    except (TypeError, ValueError):
        return False


def own_method(backend: Any, name: str) -> Callable:
    """The backend's own method (never a tracing wrapper on the instance)."""
    return getattr(type(backend), name).__get__(backend)


def _nothing() -> None:
    pass


def pick(result: Any, path: tuple[int, ...]) -> Any:
    """The item at ``path`` in a call's (nested tuple) result."""
    for i in path:
        result = result[i]
    return result


def _flat_bytes(root: Any) -> Any:
    """A NumPy root's memory as a flat uint8 array starting at its lowest byte."""
    if root.flags.c_contiguous:
        return root.reshape(-1).view(np.uint8)
    if root.flags.f_contiguous:
        return root.T.reshape(-1).view(np.uint8)
    raise RuntimeError(f"compile: cannot bind a non-contiguous buffer of shape {root.shape} by address")


class CpuReplay:
    """A plan bound to NumPy memory, replayed as a loop of pre-bound calls."""

    def __init__(self, plan: Any, backend: Any, roots: dict[int, Any], objects: list[Any]) -> None:
        graph = plan.graph
        align = plan.align
        raw = np.empty(plan.fixed_bytes + plan.arena_bytes + align, np.uint8)
        start = -address(raw) % align
        self.memory = raw[start:start + plan.fixed_bytes + plan.arena_bytes]
        self.arena_bytes = plan.arena_bytes
        regions: dict[int, tuple[Any, int]] = {}
        for s, (kind, offset) in plan.placement.items():
            if kind == "external":
                regions[s] = (_flat_bytes(roots[s]), 0)  # value offsets count from the lowest byte
            else:
                regions[s] = (self.memory, offset + (plan.fixed_bytes if kind == "arena" else 0))
        self.values = [self._view(regions, v) if v.storage in regions else None for v in graph.values]
        self.objects = objects
        self.copy_, self.copy = own_method(backend, "copy_"), own_method(backend, "copy")
        for position in plan.init:
            self._step(plan, backend, graph.nodes[position])()
        self.python_steps = tuple(self._step(plan, backend, graph.nodes[position]) for position in plan.steps)
        self.steps = self.python_steps
        self._installing = threading.Lock()
        if hasattr(type(backend), "link"):
            native = own_method(backend, "native")
            forms = [self._native_form(plan, native, graph.nodes[position]) for position in plan.steps]
            own_method(backend, "link")(list(zip(self.python_steps, forms)), self._install)
        self.inputs = [self.values[v] for v in graph.inputs]
        self.outputs = [self.values[r.value] for r in graph.output_refs()]
        self.writeback = [(i, self.inputs[i]) for i in plan.writeback]

    @staticmethod
    def _view(regions: dict[int, tuple[Any, int]], v: Any) -> Any:
        region, base = regions[v.storage]
        return np.ndarray(v.shape, v.dtype, buffer=region, offset=base + v.offset, strides=v.strides)

    def _step(self, plan: Any, backend: Any, node: Any) -> Callable[[], Any]:
        copy_ = self.copy_
        made = plan.made_results(node)
        if node.op == "constant":
            return functools.partial(copy_, self.values[made[0][1]], node.data)
        if node.op == "empty":  # an allocation: the plan has placed its storage already
            return _nothing
        fn = own_method(backend, node.op)
        args, kwargs = plan.call_arguments(node, self.values.__getitem__, self.objects.__getitem__)
        if not made:
            return functools.partial(fn, *args, **kwargs)
        dests = [(path, self.values[v]) for path, v in made]
        if made[0][0] == ():
            dest = dests[0][1]
            prepared = own_method(backend, "prepare") if hasattr(type(backend), "prepare") else None
            fast = prepared(node.op, args, kwargs, dest) if prepared is not None and dest.flags.c_contiguous else None
            if fast is not None:
                return fast
            if "out" not in kwargs and self._out_form(type(backend), node.op, args, dest):
                return functools.partial(fn, *args, out=dest, **kwargs)
            return lambda: copy_(dest, fn(*args, **kwargs))
        out = self._out_items(type(backend), node.op, args, kwargs, made)
        if out is not None:
            return functools.partial(fn, *args, out=out, **kwargs)

        def step() -> None:
            result = fn(*args, **kwargs)
            for path, dest in dests:
                copy_(dest, pick(result, path))
        return step

    def _install(self, steps: tuple[Callable[[], Any], ...]) -> None:
        """Replay ``steps`` from the next run on (a run in progress keeps its own)."""
        with self._installing:
            if self.memory is not None:
                self.steps = steps

    def _native_form(self, plan: Any, native: Callable, node: Any) -> Any:
        """The backend's native form of ``node``'s call writing its results into their
        planned buffers: ``native(op, args, kwargs, out)``, ``out`` the buffer of a
        result, a tuple of them (None for an item the call did not allocate) for a tuple
        result, None for an in-place call; [] for an allocation (nothing to run), None
        where there is none."""
        if node.op == "empty":
            return []
        if node.op == "constant":
            return None
        made = plan.made_results(node)
        if not made:
            out = None
        elif len(made) == 1 and made[0][0] == ():
            out = self.values[made[0][1]]
        elif all(len(path) == 1 for path, _ in made):  # items of a tuple result
            out = [None] * (1 + max(path[0] for path, _ in made))
            for (i,), v in made:
                out[i] = self.values[v]
            out = tuple(out)
        else:
            return None
        args, kwargs = plan.call_arguments(node, self.values.__getitem__, self.objects.__getitem__)
        return native(node.op, args, kwargs, out)

    @staticmethod
    def _out_form(cls: type, name: str, args: tuple, dest: Any) -> bool:
        """Whether the kernel can write into ``dest`` itself: its method takes ``out=``,
        the destination is contiguous and no bfloat16 array is involved (those kernels
        compute on float32 copies)."""
        if not _accepts_out(cls, name) or not dest.flags.c_contiguous or dest.dtype.name == "bfloat16":
            return False
        return not any(getattr(getattr(a, "dtype", None), "name", "") == "bfloat16" for a in args)

    def _out_items(self, cls: type, name: str, args: tuple, kwargs: dict, made: list) -> tuple | None:
        """The ``out=`` tuple of a call with a tuple result whose method takes one: the
        planned buffers of its items (None for an item the plan keeps nothing of), which
        the method writes its results into, whatever their strides (``numba/results.py``);
        None where the method takes no ``out``, the call passes its own, or a bfloat16
        array is involved (those kernels compute on float32 copies)."""
        if "out" in kwargs or not _accepts_out(cls, name) or not all(len(path) == 1 for path, _ in made):
            return None
        out = [None] * (1 + max(path[0] for path, _ in made))
        for (i,), v in made:
            out[i] = self.values[v]
        if any(d.dtype.name == "bfloat16" for d in out if d is not None) or any(
                getattr(getattr(a, "dtype", None), "name", "") == "bfloat16" for a in args):
            return None
        return tuple(out)

    def run(self, arrays: list[Any], fresh: bool = True) -> list[Any]:
        """Copy the inputs in, run every step, write modified inputs back; the outputs
        are new arrays when ``fresh``, else the plan's own buffers."""
        copy_ = self.copy_
        for buf, a in zip(self.inputs, arrays):
            copy_(buf, a)
        for step in self.steps:
            step()
        for i, buf in self.writeback:
            copy_(arrays[i], buf)
        return [self.copy(a) for a in self.outputs] if fresh else self.outputs

    def release(self) -> None:
        with self._installing:
            self.memory = None
            self.steps = self.python_steps = ()
        self.values, self.inputs, self.outputs = [], [], []
