"""Compiling a known list of kernels in a second process, while the first one runs.

On a cold cache a model's first step compiles its kernels one after another: Numba
holds one lock per process around every compile, so a process compiles on one core
whatever the machine has.  A second process can compile other kernels at the same time
into the same on-disk cache (``cache=True``), and a kernel it has finished loads from
there when the first process reaches it instead of compiling again.

* ``record()`` lists the kernels a block of code compiles, in order, each with the
  argument types it was compiled for (``encode`` turns them into JSON data).
* ``compile_kernels`` compiles such a list (``python -m tensorcore.backends.numba.warmup``
  runs it in a process of its own, the list as JSON on its standard input).
* ``BackgroundCompiles`` starts that process when the first kernel compiles in this
  one (a warm cache starts nothing), compiling the list in ``background_order``: the
  kernels of the first (eager) step from the last back while this process compiles
  them from the first, so the two meet in the middle of what the first step needs,
  then the compiled step's kernels, again from the back.  Whichever comes second to a
  kernel loads it from the cache.  A kernel's first call in this process waits while
  the other one is compiling it (it leaves a marker file meanwhile), so the two never
  compile the same kernel at once where they meet.

The kernels of the ``kernels`` modules are listed by module and name (the functions
Python calls; the helpers they call compile with them), the generated fused loops of a
compiled plan (``numba/fused.py``) by their program and loop layout, from which the
second process generates the same source and so shares the cache file.  A listed kernel
that no longer exists, or that a run does not use, costs the second process its compile
time and nothing else.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import kernel_cache, threads

# The kernels' argument types as JSON data: a scalar type's name ("int64", "float64",
# "bool", "none"), {"literal": 4} for a compile-time constant (an activation code), or
# {"array": "float32", "ndim": 4, "layout": "C", "readonly": false}.
Entry = dict[str, Any]  # {"module": ..., "name": ..., "args": [...]} or {"fused": [program, layout], ...}


def encode(arg: Any) -> Any:
    """One argument's Numba type as JSON data (the format above)."""
    from numba.core import types

    if isinstance(arg, types.IntegerLiteral):
        return {"literal": arg.literal_value}
    if isinstance(arg, types.Array) and arg.aligned:
        return {"array": str(arg.dtype), "ndim": arg.ndim, "layout": arg.layout, "readonly": not arg.mutable}
    if isinstance(arg, types.NoneType):
        return "none"
    if isinstance(arg, types.Boolean):
        return "bool"
    if isinstance(arg, (types.Integer, types.Float)):
        return str(arg)
    raise TypeError(f"warmup.encode: cannot write the argument type {arg} as JSON data")


def decode(arg: Any) -> Any:
    """The Numba type that ``encode`` wrote as ``arg``."""
    from numba.core import types
    from numba.np.numpy_support import from_dtype

    if isinstance(arg, dict) and "literal" in arg:
        return types.literal(arg["literal"])
    if isinstance(arg, dict) and "array" in arg:
        return types.Array(from_dtype(np.dtype(arg["array"])), arg["ndim"], arg["layout"],
                           readonly=arg["readonly"])
    if arg == "none":
        return types.none
    if arg == "bool":
        return types.boolean
    if isinstance(arg, str) and isinstance(getattr(types, arg, None), (types.Integer, types.Float)):
        return getattr(types, arg)
    raise ValueError(f"warmup.decode: {arg!r} is not an argument type that encode writes")


def dispatcher_of(module: str, name: str) -> Any:
    """The Numba dispatcher of the kernel ``module.name`` (a parallel kernel's own)."""
    kernel = getattr(importlib.import_module(module), name)
    return getattr(kernel, "dispatcher", kernel)


def entry_dispatcher(entry: Entry) -> Any:
    """The Numba dispatcher an entry names: a kernel of ``kernels``, or a fused loop
    generated again from its program and layout (its "serial" or "parallel" kernel)."""
    if "fused" not in entry:
        return dispatcher_of(entry["module"], entry["name"])
    from .fused import kernels

    program, layout = entry["fused"]
    serial, parallel = kernels(_as_tuples(program), layout)
    return {"serial": serial, "parallel": parallel}[entry["name"]]


def _as_tuples(value: Any) -> Any:
    """A program read back from JSON (lists) as the nested tuples it was."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list) else value


def _listed(dispatcher: Any) -> Entry | None:
    """The entry naming ``dispatcher`` (its "args" left to the caller): a kernel that a
    module of ``kernels`` holds under its name, or a generated fused loop; else None."""
    from .fused import origin

    func = dispatcher.py_func
    generated = origin(func.__module__)
    if generated is not None:
        return {"fused": list(generated), "name": func.__qualname__}
    if not func.__module__.startswith(kernel_cache.KERNELS_PACKAGE):
        return None
    try:
        found = dispatcher_of(func.__module__, func.__qualname__)
    except (ImportError, AttributeError):
        return None
    return {"module": func.__module__, "name": func.__qualname__} if found is dispatcher else None


_recording: set = set()  # the recorders active in this process: no second process then


@contextlib.contextmanager
def record() -> Iterator[list[Entry]]:
    """The kernels compiled inside the block (not loaded from the cache), in the order
    their compiles started, each once per argument types; a kernel compiled while
    another one compiles (a helper) is left out."""
    from numba.core import event

    compiled: list[Entry] = []

    class Recorder(event.Listener):
        depth = 0

        def on_start(self, ev: event.Event) -> None:
            self.depth += 1
            named = _listed(ev.data["dispatcher"]) if self.depth == 1 else None
            if named is not None:
                compiled.append({**named, "args": [encode(arg) for arg in ev.data["args"]]})

        def on_end(self, ev: event.Event) -> None:
            self.depth -= 1

    recorder = Recorder()
    event.register("numba:compile", recorder)
    _recording.add(recorder)
    try:
        yield compiled
    finally:
        _recording.discard(recorder)
        event.unregister("numba:compile", recorder)


def compile_kernels(entries: list[Entry], markers: str | None = None) -> list[str]:
    """Compile every entry (or load it from the cache, where another process has put it);
    returns one line per entry that could not be compiled, naming it and why.  With
    ``markers`` (a directory), a file named after the kernel (``marker_name``) lies
    there while it compiles."""
    failed = []
    for entry in entries:
        marker = None
        try:
            dispatcher = entry_dispatcher(entry)
            if markers is not None:
                func = dispatcher.py_func
                marker = os.path.join(markers, marker_name(func.__module__, func.__qualname__))
                open(marker, "w").close()
            dispatcher.compile(tuple(decode(a) for a in entry["args"]))
        except Exception as exc:  # a list made by another version: the run compiles what it needs itself
            failed.append(f"{entry.get('module', 'fused')}.{entry.get('name')}: {exc}")
        finally:
            if marker is not None:
                with contextlib.suppress(OSError):
                    os.unlink(marker)
    return failed


def background_order(entries: list[Entry]) -> list[Entry]:
    """The order the second process compiles ``entries`` (listed in the order a run
    compiles them) in: those before the first generated fused loop (an eager step's
    kernels: fused loops come with a compiled plan) from the last back, then the rest
    from the last back.  So the two processes meet in the middle of what the first
    step needs, and the second does not spend that time on kernels needed later."""
    first_fused = next((i for i, entry in enumerate(entries) if "fused" in entry), len(entries))
    return entries[:first_fused][::-1] + entries[first_fused:][::-1]


def marker_name(module: str, name: str) -> str:
    """The file that marks kernel ``module.name`` as being compiled by the second process."""
    return f"{module}.{name}"


class BackgroundCompiles:
    """Inside ``with BackgroundCompiles(entries):``, the first compile of a tensorcore kernel
    in this process starts a process that compiles ``entries`` in ``background_order``;
    on leaving the block, that process is stopped if it still runs.

    Where the two meet, this process would compile a kernel the other one is in the
    middle of.  Instead, a kernel's first call here waits while the other process
    compiles it (it marks that with a file, ``marker_name``), then loads it from the
    cache."""

    WAIT_AT_MOST = 60.0  # seconds a first call waits for the other process

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.process: subprocess.Popen | None = None
        self.markers: str | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> BackgroundCompiles:
        from numba.core import event

        owner = self

        class Starter(event.Listener):
            def on_start(self, ev: event.Event) -> None:
                if kernel_cache.is_tensorcore_kernel(ev.data["dispatcher"]):
                    owner.start()

            def on_end(self, ev: event.Event) -> None:
                pass

        self._listener = Starter()
        event.register("numba:compile", self._listener)
        return self

    def start(self) -> None:
        """Start the compiling process, once (not while ``record()`` lists this process's
        compiles: they would be made elsewhere)."""
        with self._lock:
            if self.process is not None or _recording:
                return
            # the numpy backend: the process needs the kernels only, not the backend's
            # thread pools or its compile notice
            env = {**os.environ, "TENSORCORE_BACKEND": "numpy"}
            self.markers = tempfile.mkdtemp(prefix="tensorcore-compiling-")
            self.process = subprocess.Popen([sys.executable, "-m", __name__, self.markers], env=env,
                                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
            self.process.stdin.write(json.dumps(background_order(self.entries)))  # read as it starts
            self.process.stdin.close()
            threads.before_first_call = self.wait_for

    def wait_for(self, kernel: Any) -> None:
        """Return once the other process is not compiling ``kernel`` (a ``SizedKernel``),
        or has ended, or after ``WAIT_AT_MOST`` seconds."""
        marker = os.path.join(self.markers, marker_name(kernel.__module__, kernel.__name__))
        deadline = time.monotonic() + self.WAIT_AT_MOST
        while os.path.exists(marker) and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)

    def __exit__(self, *exc: Any) -> None:
        from numba.core import event

        event.unregister("numba:compile", self._listener)
        if threads.before_first_call == self.wait_for:
            threads.before_first_call = None
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # Numba writes each cache file whole, so stopping is safe
            self.process.wait()
        if self.markers is not None:
            shutil.rmtree(self.markers, ignore_errors=True)


def main(argv: list[str]) -> int:
    """``python -m tensorcore.backends.numba.warmup [MARKERS] < LIST.json``: compile the
    list, in its order, into Numba's cache, marking each kernel in the directory MARKERS
    while it compiles."""
    if len(argv) > 1 or argv[:1] in (["-h"], ["--help"]):
        print("usage: python -m tensorcore.backends.numba.warmup [MARKERS] < LIST.json", file=sys.stderr)
        return 2
    entries = json.load(sys.stdin)
    failed = compile_kernels(entries, argv[0] if argv else None)
    if failed:
        print(f"tensorcore: {len(failed)} of {len(entries)} listed kernels did not compile in the background "
              f"(the run compiles what it needs itself), the first: {failed[0]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
