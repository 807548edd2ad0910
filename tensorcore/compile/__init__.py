"""``tc.compile``: trace a call once, replay its plan on later calls.

    step = tc.compile(model)          # or @tc.compile on a function
    y = step(x)                       # first call with this key: traced (returns the right y)
    y = step(x2)                      # same key: the plan is replayed

The stages, one module each: ``trace`` records the backend calls of a call into a
``graph``; ``passes`` rewrite the graph (dead-code elimination, common-subexpression
elimination, elementwise fusion); ``plan`` lowers it to init calls, replayed steps and
a static memory plan; the backend's executor (``backend.executor``) binds the plan to
memory and runs it (a loop of pre-bound calls on the CPU, one CUDA graph on the GPU).
Around them: ``key`` (what a call's key is made of), ``lru`` (the plans kept in
memory), ``entry`` (a bound plan and the lease a replaying call holds on it),
``roots`` (the modules a call uses), ``identity``, ``encoding``, ``signing`` and
``disk`` (the disk cache), ``host`` (the compiled callable's call path),
``asynchronous`` (``call_async`` off the event loop) and ``chaining`` (compiled stages
in sequence).  Code below the compiler reaches it only through ``tensorcore.tracing``.
See docs/compile.md.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ..tracing import guard, host_effect, is_tracing
from .chaining import Chain, chain
from .disk import UnsafeCacheWarning
from .host import CacheInfo, Compiled, CompileWarning
from .trace import TraceError


def compile(fn: Callable | None = None, *, passes: Iterable | None = None, cache_dir: Any = None,  # noqa: A001
            max_plans: int = 16, fallback: str = "raise", reuse_outputs: bool = False) -> Any:
    """Compile a function or a Module; usable as ``@tc.compile`` and ``@tc.compile(...)``.

    passes: graph passes to run: a list of names / callables, a dict of switches over
        the default pipeline (``{"fuse_elementwise": False}``), or None for the default
        pipeline (``passes.DEFAULT``).
    cache_dir: directory of the disk cache (None: ``TENSORCORE_CACHE_DIR`` or
        ``~/.cache/tensorcore``; False: no disk cache).
    max_plans: plans kept in memory (least recently used go first).
    fallback: "raise" -- a trace that reads a value to the host raises ``TraceError``;
        "eager" -- that input signature runs eagerly from then on (one warning).
    reuse_outputs: return tensors backed by the plan's own output buffers (no copy;
        the next call of the same signature overwrites them).
    """
    options = dict(passes=passes, cache_dir=cache_dir, max_plans=max_plans, fallback=fallback,
                   reuse_outputs=reuse_outputs)
    if fn is None:
        return lambda f: Compiled(f, **options)
    return Compiled(fn, **options)


compile.TraceError = TraceError  # type: ignore[attr-defined]
compile.CompileWarning = CompileWarning  # type: ignore[attr-defined]
compile.CacheInfo = CacheInfo  # type: ignore[attr-defined]

__all__ = ["compile", "chain", "Chain", "Compiled", "CacheInfo", "CompileWarning", "TraceError",
           "UnsafeCacheWarning", "guard", "host_effect", "is_tracing"]
