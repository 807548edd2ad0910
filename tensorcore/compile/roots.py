"""The program around a compiled function: which modules (roots) a call uses.

A compiled Module is its own root; a compiled function's roots are the modules passed
as arguments and those its closure, ``self`` and globals refer to, read on every call
(they may be re-bound).  A plan is keyed on its roots' structure versions and training
flags, binds their parameters and buffers by name, and is named on disk by their code
and structure.
"""

from __future__ import annotations

import operator
from itertools import chain
from typing import Any, Callable, Iterable

from ..tensor import Tensor
from .key import is_root_type

_TRAINING = operator.attrgetter("training")


class Roots:
    """Finds the roots of ``fn``'s calls, remembering what it read last time."""

    def __init__(self, fn: Callable) -> None:
        self._fn = fn
        self._sources = _root_sources(fn)
        self._namespace, self._global_names = _global_names(fn)
        # the globals' values read last time, and the modules among them by name
        self._globals_seen: tuple[tuple, list[tuple[str, Any]]] = ((), [])
        self._fn_is_module = is_module(fn)
        self._last_seen: list[tuple[Any, bool] | None] = [None] * len(self._sources)
        self._modules_cache: dict[tuple[int, int], list] = {}
        self._modes_cache: dict[tuple[int, int, int], tuple[bool, ...]] = {}

    def of_call(self, args: tuple = (), positions: list[int] | None = None) -> list[tuple[str, Any]]:
        """The modules the call uses, by a stable name: the compiled module itself, or
        the modules passed as arguments (at ``positions`` when known) and those the
        function's closure, ``self`` and globals refer to (read on every call: they may
        be re-bound; what each name held last time is remembered)."""
        found, seen, last = [], set(), self._last_seen
        if positions is None:
            positions = [i for i, a in enumerate(args) if is_root_type(type(a))]
        for i in positions:
            a = args[i]
            if id(a) not in seen:
                seen.add(id(a))
                found.append((f"arg{i}", a))
        if self._fn_is_module:
            return found + [("", self._fn)] if id(self._fn) not in seen else found
        for i, (name, read) in enumerate(self._sources):
            try:
                value = read()
            except ValueError:  # an empty closure cell
                continue
            previous = last[i]
            if previous is None or previous[0] is not value:
                previous = last[i] = (value, is_module(value))
            if previous[1] and id(value) not in seen:
                seen.add(id(value))
                found.append((name, value))
        if self._global_names:  # read all at once; looked at again only when one changed
            values = tuple(map(self._namespace.get, self._global_names))  # a deleted one reads as None
            before, modules = self._globals_seen
            if len(before) != len(values) or not all(map(operator.is_, values, before)):
                modules = [(name, v) for name, v in zip(self._global_names, values) if is_module(v)]
                self._globals_seen = (values, modules)
            for name, value in modules:
                if id(value) not in seen:
                    seen.add(id(value))
                    found.append((name, value))
        return found

    def modules(self, root: Any, version: int) -> list:
        """Every submodule of ``root`` (cached per structure version)."""
        cached_key = (id(root), version)
        modules = self._modules_cache.get(cached_key)
        if modules is None:
            if len(self._modules_cache) > 64:
                self._modules_cache.clear()
            modules = self._modules_cache[cached_key] = [m for _, m in root.named_modules()]
        return modules

    def modes(self, root: Any, version: int) -> tuple[bool, ...]:
        """The ``training`` flags of every submodule of ``root``, read again only after a
        module's mode changed (``mode_version``) or the structure did."""
        changes = getattr(root, "mode_version", None)
        cached_key = (id(root), version, changes)
        found = self._modes_cache.get(cached_key) if changes is not None else None
        if found is None:
            found = tuple(map(_TRAINING, self.modules(root, version)))
            if changes is not None:
                if len(self._modes_cache) > 64:
                    self._modes_cache.clear()
                self._modes_cache[cached_key] = found
        return found

    @staticmethod
    def named(roots: list[tuple[str, Any]]) -> list[tuple[str, Tensor]]:
        """(stable name, tensor) of every parameter and buffer of the roots."""
        named = []
        for prefix, root in roots:
            for name, t in chain(root.named_parameters(), root.named_buffers()):
                named.append((f"{prefix}.{name}" if prefix else name, t))
        return named


def is_module(obj: Any) -> bool:
    """Whether ``obj`` is a module (a root): it has a structure version and parameters."""
    return hasattr(type(obj), "structure_version") and hasattr(obj, "named_parameters")


def label(fn: Any) -> str:
    """The name a compiled callable goes by in messages."""
    if is_module(fn):
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _root_sources(fn: Any) -> list[tuple[str, Callable[[], Any]]]:
    """Where a function's modules are found besides its globals, as (name, reader)
    pairs read on every call (closure cells may be re-bound); none for a module."""
    if is_module(fn):
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
    if is_module(fn) or code is None:
        return {}, ()
    return getattr(func, "__globals__", {}), tuple(dict.fromkeys(_code_names(code)))


def _code_names(code: Any) -> Iterable[str]:
    yield from code.co_names
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            yield from _code_names(const)
