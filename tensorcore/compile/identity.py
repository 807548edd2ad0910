"""The model identity: which code and structure a plan on disk was made for.

The identity hashes the module tree's classes (their code), ``extra_repr``, config,
parameter and buffer names, shapes and dtypes -- never their values -- with the plan
format, the tensorcore version and a digest of tensorcore's sources (kernels included),
so a plan made by other code is never reused.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from .. import __version__
from .encoding import FORMAT


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
            for kind, members in (("p", module.named_parameters(recurse=False)),
                                  ("b", module.named_buffers(recurse=False))):
                for member, t in members:
                    h.update(f"{kind}:{member}:{(tuple(t.shape), str(t.dtype), t.device)}".encode())
    return h.hexdigest()
