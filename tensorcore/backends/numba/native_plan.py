"""Compiled plans on the Numba backend as native code: runs of steps become one jitted call.

``CpuReplay`` (``numpy/executor.py``) binds every step of a plan as a Python call.  On
this backend it also asks, per step, for the step's *native form* (``NumbaBackend.native``):
the jitted functions the eager call runs, with the arguments it passes them -- the
same kernels (``kernels/``), the same generated fused loops (``fused.py``), NumPy's own
BLAS product (``blas.py``), plain copies into the planned buffers.  ``link`` then
replaces each run of consecutive steps that have one by a *segment*: one generated
``@njit`` function calling those functions in plan order, its parameters the arrays
and numbers they take (bound once; each replay makes one call, with no Python per
step).  A step without a native form (a reduction, a convolution, a dtype the kernels
do not cover...) stays the Python call between two segments, so every plan runs.

Results are those of eager mode bit for bit: each kernel is the very dispatcher eager
mode calls, for the same argument types (so the same machine code), run on as many
threads as eager mode runs it (``threads.runs_serially``: the segment sets Numba's
thread count before each parallel kernel as ``SizedKernel`` does, and puts back the
count it found).  Numbers reach the kernels as parameters, never as constants in the
source, so the compiler cannot fold them into the kernels' arithmetic; only the
activation codes (compile-time constants in eager mode too) and ``None`` are written in.

Compile time: a segment compiles in a second or so; the plan of a UNet's train step
has a few hundred.  ``link`` loads the segments the disk cache holds; when at most
``SYNC_COMPILES`` are missing it compiles them before the plan's first replay; up to
``BACKGROUND_COMPILES`` the plan replays its Python steps while a background thread
compiles them, and the segments take over from the next replay once all are ready
(``wait`` waits for that).  A plan missing more stays a Python loop: its steps are
large enough that Python is a small share of them (the digits train step: ~215
segments, minutes of compiling that slow the steps meanwhile, for ~6 ms of Python in a
~100 ms step), while the plans native code is for -- small calls -- have few.

Cache: a segment's source names every function it calls (fused loops by the digest of
their source) and the Numba / NumPy versions; it is written to
``<TENSORCORE_CACHE_DIR>/kernels/numba/<fingerprint of the kernel sources>/native/
native_<hash of the source>.py`` and compiled, under that name, with ``cache=True``, so
another process -- or another plan of the same structure, whatever its shapes --
loads the machine code.  Where that directory cannot be written it compiles in memory.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from llvmlite import ir
from numba import types
from numba.core.compiler_lock import global_compiler_lock
from numba.core import cgutils
from numba.extending import intrinsic

from . import kernel_cache, threads
from .fused import load_module

log = logging.getLogger("tensorcore.compile")

SYNC_COMPILES = 4  # segments missing from the disk cache that a bind compiles itself
BACKGROUND_COMPILES = 32  # more missing than this: the plan stays a Python loop (see above)
_HELPERS = tuple(Path(__file__).with_name(name) for name in ("native_plan.py", "blas.py", "numpy_sums.py"))  # what a segment inlines outside kernels/


@dataclass(frozen=True)
class Literal:
    """An argument written into the source as a constant (an activation code, which
    the kernels require as a compile-time constant)."""

    value: int


@dataclass(eq=False)
class NativeCall:
    """One call of a segment: ``function(*args)``, its result copied into ``into``:
    nothing for None, a 1-D array the result's values go to in C order (the eager
    method reshapes the result to its buffer's shape), or a tuple of those (or None)
    for a tuple result.  ``name``: the function's name in the source (stable across
    processes); ``parallel``: True / False for a ``SizedKernel``'s dispatcher (run on
    every thread / on one), None for a serial function (the thread count is left as it is).
    A ``function`` of None copies ``args[1]`` into ``args[0]``."""

    name: str
    function: Any
    args: tuple
    into: Any = None
    parallel: bool | None = None


@intrinsic
def swap_thread_count(typingctx, n):
    """Set the calling thread's Numba thread count to ``n``; return the previous one.
    (The threading layer's C entry points, called as Numba's parallel code calls them:
    ``numba.set_num_threads`` reaches them through an address that would keep the
    segment out of the disk cache.)"""
    if not isinstance(n, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        get = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, []), "get_num_threads")
        put = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i32]), "set_num_threads")
        previous = builder.call(get, [])
        builder.call(put, [builder.trunc(context.cast(builder, args[0], n, types.int64), i32)])
        return previous

    return types.int64(n), codegen


def kernel_call(kernel: Any, *args: Any, into: Any = None) -> NativeCall:
    """A call of the parallel kernel ``kernel`` (a ``threads.SizedKernel``), on as many
    threads as calling it from Python would use."""
    dispatcher = kernel.dispatcher
    module = dispatcher.py_func.__module__.rpartition(".")[2]
    sized = tuple(a for a in args if not isinstance(a, Literal))
    return NativeCall(f"{module}_{dispatcher.py_func.__name__}", dispatcher, args, into,
                      not threads.runs_serially(sized))


def copy_call(dest: Any, src: Any) -> NativeCall:
    """``dest[...] = src``."""
    return NativeCall("", None, (dest, src))


def gemm_call(a: Any, b: Any, out: Any) -> NativeCall | None:
    """The backend's ``matmul(a, b, out=out)`` for 2-D operands (or a stack of matrices
    times one, ``stacked_rows``), or None where NumPy computes it
    otherwise than by one ``cblas_?gemm`` call (``blas.gemm_arguments``)."""
    from ..numpy.backend import stacked_rows
    from . import blas

    a, b, out = stacked_rows(a, b, out) or (a, b, out)
    found = blas.gemm_arguments(a, b, out)
    if found is None:
        return None
    trans_a, trans_b, m, n, k, lda, ldb, ldc = found
    return NativeCall("blas_gemm", blas.gemm, (blas.gemm_address(out.dtype.name), trans_a, trans_b, m, n, k,
                                               a, lda, b, ldb, out, ldc))


def source(calls: Sequence[NativeCall]) -> tuple[str, list[Any], dict[str, Any]]:
    """(the segment's source, its parameters after the thread count, the functions it
    calls by name): ``segment(threads, p0, p1, ...)``."""
    params: list[Any] = []
    index: dict[Any, str] = {}

    def param(value: Any) -> str:
        if isinstance(value, Literal):
            return repr(value.value)
        if value is None:
            return "None"
        key = id(value) if isinstance(value, np.ndarray) else (type(value), value)
        if key not in index:
            index[key] = f"p{len(params)}"
            params.append(value)
        return index[key]

    functions: dict[str, Any] = {}
    body: list[str] = []
    count = None  # the thread count set last: None (unknown), "1" or "threads"
    for call in calls:
        args = ", ".join(param(a) for a in call.args)
        if call.function is None:
            dest, src = (param(a) for a in call.args)
            body.append(f"{dest}[...] = {src}")
            continue
        if functions.setdefault(call.name, call.function) is not call.function:
            raise ValueError(f"native plan: two functions named {call.name}")
        if call.parallel is not None:
            wanted = "threads" if call.parallel else "1"
            if wanted != count:
                body.append(f"saved = swap_thread_count({wanted})" if count is None else f"swap_thread_count({wanted})")
                count = wanted
        expression = f"{call.name}({args})"
        if call.into is None:
            body.append(expression)
        elif isinstance(call.into, tuple):
            body.append(f"result = {expression}")
            body += [f"{param(dest)}[...] = result[{i}].ravel()" for i, dest in enumerate(call.into) if dest is not None]
        else:
            body.append(f"{param(call.into)}[...] = {expression}.ravel()")
    sized = count is not None
    lines = ['"""A compiled plan segment generated by tensorcore.backends.numba.native_plan."""',
             f"# {_versions()}",
             "from numba import njit",
             "from tensorcore.backends.numba.native_plan import swap_thread_count",
             "",
             "",
             "@njit(cache={cache})",
             f"def segment({', '.join(['threads'] + [f'p{i}' for i in range(len(params))])}):"]
    lines += ["    " + line for line in body]
    lines += ["    swap_thread_count(saved)"] if sized else []
    return "\n".join(lines) + "\n", params, functions


def _versions() -> str:
    """What the machine code of a segment depends on besides its text and the kernels."""
    import numba

    helpers = hashlib.sha256(b"".join(p.read_bytes() for p in _HELPERS)).hexdigest()[:16]
    return f"numba {numba.__version__}, numpy {np.__version__}, helpers {helpers}"


_segments: dict[str, Any] = {}  # source -> its jitted function: segments of one text share it
_segments_lock = threading.Lock()


def compiled(text: str, functions: dict[str, Any]) -> Any:
    """The jitted ``segment`` of ``text``, cached on disk by the hash of ``text`` and in
    this process by ``text`` (the names in a text fix the functions it calls)."""
    with _segments_lock:
        found = _segments.get(text)
        if found is None:
            found = _segments[text] = _compiled(text, functions)
        return found


def _compiled(text: str, functions: dict[str, Any]) -> Any:
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    path = kernel_cache.fused_dir() / "native" / f"native_{digest}.py"
    module = load_module(path, text.replace("{cache}", "True"), f"tensorcore_native_{digest}", functions)
    if module is None:
        namespace = dict(functions)
        exec(compile(text.replace("{cache}", "False"), f"<native {digest}>", "exec"), namespace)  # noqa: S102
        return namespace["segment"]
    return module.segment


class Segment:
    """A run of steps as one call of its generated function (compiled on first call,
    or by ``load`` / ``compile``; ``origin`` says which: "disk" or "compiled")."""

    def __init__(self, calls: Sequence[NativeCall]) -> None:
        self.text, params, functions = source(calls)
        self.function = compiled(self.text, functions)
        self.params = tuple(params)
        self.calls = len(calls)
        self.origin: str | None = None

    def _signature(self) -> tuple:
        typeof = self.function.typeof_pyval
        return tuple(typeof(a) for a in (threads.get_num_threads(), *self.params))

    def load(self) -> bool:
        """Load the machine code from the disk cache; whether it was there.  Under Numba's
        compile lock, as its own dispatchers load: plans bound on several threads at once
        would otherwise read one cache index together."""
        signature = self._signature()
        with global_compiler_lock:
            if signature in self.function.overloads:
                self.origin = self.origin or "compiled"
                return True
            try:
                found = self.function._cache.load_overload(signature, self.function.targetctx)
            except AttributeError:  # a Numba without this cache interface: compile instead
                return False
            if found is None:
                return False
            self.function.add_overload(found)
        self.origin = "disk"
        return True

    def compile(self) -> None:
        self.function.compile(self._signature())
        self.origin = "compiled"

    def __call__(self) -> None:
        try:
            self.function(threads.get_num_threads(), *self.params)
        except BaseException:
            threads.forget_thread_count()
            raise


def link(steps: Sequence[tuple[Callable[[], Any], list[NativeCall] | None]],
         install: Callable[[tuple[Callable[[], Any], ...]], None]) -> None:
    """``install`` the replay's calls for ``steps`` ((Python call, native form or None)
    in plan order): each run of steps with a native form as one ``Segment``, the others
    as they are -- now, or from a background thread once the segments missing from the
    disk cache are compiled (see the module docstring)."""
    out: list[Callable[[], Any]] = []
    run: list[NativeCall] = []
    for step, calls in steps:
        if calls is None:
            if run:
                out.append(Segment(run))
                run = []
            out.append(step)
        else:
            run.extend(calls)
    if run:
        out.append(Segment(run))
    missing = [s for s in out if isinstance(s, Segment) and not s.load()]
    if len(missing) > BACKGROUND_COMPILES:
        log.debug("native plan: %d segments missing from the disk cache, the plan stays a Python loop",
                  len(missing))
        return
    if len(missing) <= SYNC_COMPILES:
        for segment in missing:
            segment.compile()
        install(tuple(out))
        return
    log.debug("native plan: compiling %d segments in the background", len(missing))
    worker = threading.Thread(target=_compile_then_install, args=(missing, tuple(out), install),
                              name="tensorcore-native-plan", daemon=True)
    with _workers_lock:
        _workers.append(worker)
    worker.start()


_workers: list[threading.Thread] = []
_workers_lock = threading.Lock()


def _compile_then_install(missing: list[Segment], calls: tuple, install: Callable[[tuple], None]) -> None:
    try:
        for segment in missing:
            segment.compile()
            time.sleep(0.005)  # Numba's compile lock is not fair: let a replay that needs it take it
        install(calls)
    except Exception as exc:  # noqa: BLE001  (the plan keeps replaying its Python steps)
        log.warning("native plan: a segment failed to compile, the plan stays a Python loop (%s: %s)",
                    type(exc).__name__, exc)
    finally:
        with _workers_lock:
            _workers.remove(threading.current_thread())


def wait() -> None:
    """Wait until every background compile of segments has finished (and installed them)."""
    while True:
        with _workers_lock:
            pending = list(_workers)
        if not pending:
            return
        for worker in pending:
            worker.join()
