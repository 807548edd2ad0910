"""Compiling kernels in other processes, while the run goes on without them.

On a cold cache a model's first step would compile its kernels one after another (Numba
holds one lock per process around every compile), about a second apiece.  A second
process can compile them into the same on-disk cache (``cache=True``) instead, and a
kernel it has finished loads from there in the first process without compiling.

* ``record()`` lists the kernels a block of code compiles, in order, each with the
  argument types it was compiled for (``encode`` turns them into JSON data).
* ``serve`` compiles such a list, then each kernel handed over while it runs
  (``python -m tensorcore.backends.numba.warmup`` runs it in a process of its own,
  the list on its standard input, and prints each kernel's key when it is compiled).
* ``BackgroundCompiles`` starts that process when the first kernel compile starts in
  this one (a warm cache starts nothing).  From then on this process compiles no
  kernel a backend call asks for: it hands the kernel over, ahead of the list, and
  the call runs the op's NumPy reference (``deferral``) until the kernel is in the
  cache.

The kernels of the ``kernels`` modules are listed by module and name (the functions
Python calls; the helpers they call compile with them), the generated fused loops of a
compiled plan (``numba/fused.py``) by their program and loop layout, from which the
compiling process generates the same source and so shares the cache file.  A listed kernel
that no longer exists, or that a run does not use, costs a compiling process its compile
time and nothing else.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import deferral, kernel_cache, threads
from ... import settings

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


_recording: set = set()  # the recorders active in this process: no compiling processes then


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


def entry_key(entry: Entry) -> str:
    """One line naming ``entry`` (its JSON with sorted keys): what a compiling process
    prints when it has compiled it."""
    return json.dumps(entry, sort_keys=True)


def compile_entry(entry: Entry) -> str | None:
    """Compile ``entry`` (or load it from the cache, where it already is); None, or a
    line naming it and why it could not be compiled."""
    try:
        entry_dispatcher(entry).compile(tuple(decode(a) for a in entry["args"]))
    except Exception as exc:  # a list made by another version: the run compiles what it needs itself
        return f"{entry.get('module', 'fused')}.{entry.get('name')}: {exc}"
    return None


def default_processes() -> int:
    """Compiling processes for ``BackgroundCompiles``: ``TENSORCORE_COMPILE_PROCESSES``
    when set, else one per core but one, at least two (on 2 cores, beside the run's
    steps, two compiled the default train step's kernels in about 55 s, one in 65-75 s),
    at most four (each holds Numba and LLVM, some 200 MB)."""
    chosen = settings.compile_processes()
    return max(2, min(4, (os.cpu_count() or 2) - 1)) if chosen is None else chosen


class BackgroundCompiles:
    """Inside ``with BackgroundCompiles(entries):``, the first compile of a tensorcore kernel
    in this process starts ``processes`` processes that compile ``entries``, in order,
    into the disk cache, each taking the next one when it is done; on leaving the
    block, they are stopped.

    Meanwhile this process compiles no kernel that a backend call asks for: the kernel
    goes to the next free process, ahead of the listed ones, and the call runs its NumPy
    reference (``deferral``); once compiled there, the kernel loads from the cache at
    its next call.  So a cold run's first step starts at once, on slower kernels,
    instead of waiting for every kernel to compile.  ``pending()`` says whether anything
    listed or handed over is still to compile: ``tc.compile`` binds no plan until then
    (its calls run eagerly), so that a plan binds the compiled kernels."""

    def __init__(self, entries: list[Entry], processes: int | None = None) -> None:
        processes = default_processes() if processes is None else processes
        if processes < 1:
            raise ValueError(f"BackgroundCompiles: processes must be at least 1, got {processes}")
        self.entries = entries
        self.processes: list[subprocess.Popen] = []
        self._listed = collections.deque(entries)  # not handed to a process yet
        self._urgent: collections.deque[Entry] = collections.deque()  # asked for by this process
        self._seen = {entry_key(entry) for entry in entries}  # listed or asked for
        self._compiled: set[str] = set()  # reported done by a process
        self._in_flight: dict[int, str] = {}  # process index -> the key it compiles
        self._count = processes
        self._lock = threading.Lock()
        self._depth = 0  # compiles in progress in this process (a kernel's helpers nest)
        self._threads_before: int | None = None  # this process's thread count while others compile

    def __enter__(self) -> BackgroundCompiles:
        from numba.core import event

        owner = self

        class Deferrer(event.Listener):
            def on_start(self, ev: event.Event) -> None:
                owner._depth += 1
                if owner._depth == 1 and kernel_cache.is_tensorcore_kernel(ev.data["dispatcher"]):
                    owner.take_over(ev.data["dispatcher"], ev.data["args"])

            def on_end(self, ev: event.Event) -> None:
                owner._depth -= 1

        self._listener = Deferrer()
        event.register("numba:compile", self._listener)
        self._notice, kernel_cache.notice = kernel_cache.notice, kernel_cache.DEFERRED_NOTICE
        deferral.compiler = self
        return self

    def start(self) -> None:
        """Start the compiling processes, once (not while ``record()`` lists this process's
        compiles: they would be made elsewhere)."""
        with self._lock:
            if self.processes or _recording:
                return
            # the numpy backend: a process needs the kernels only, not the backend's
            # thread pools or its compile notice
            env = {**os.environ, "TENSORCORE_BACKEND": "numpy"}
            for index in range(self._count):
                process = subprocess.Popen([sys.executable, "-m", __name__], env=env, stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True, bufsize=1)
                self.processes.append(process)
                threading.Thread(target=self._read_compiled, args=(index,), daemon=True).start()
                self._hand_next(index)

    def _running(self) -> bool:
        return bool(self.processes) and any(process.poll() is None for process in self.processes)

    def take_over(self, dispatcher: Any, args: tuple) -> None:
        """At the start of a compile in this process: start the other processes if need be
        and, inside a deferrable backend call, hand the kernel over and raise
        ``KernelPending``; else let the compile go on here."""
        self.start()
        if not deferral.in_deferrable_call() or not self._running():
            return
        named = _listed(dispatcher)
        if named is None:
            return
        try:
            entry = {**named, "args": [encode(arg) for arg in args]}
        except TypeError:
            return  # an argument type the list cannot hold: compiled here
        key = entry_key(entry)
        with self._lock:
            if key not in self._seen or entry in self._listed:
                self._seen.add(key)
                with contextlib.suppress(ValueError):
                    self._listed.remove(entry)
                self._urgent.append(entry)
                for index in range(len(self.processes)):
                    if index not in self._in_flight:
                        self._hand_next(index)
            elif key in self._compiled or (key not in self._in_flight.values() and entry not in self._urgent):
                return  # compiled there yet not in the cache, or lost with a stopped process: compiled here
        raise deferral.KernelPending(key)

    def _hand_next(self, index: int) -> None:
        """Under the lock: give process ``index`` the next entry, the asked-for first."""
        self._in_flight.pop(index, None)
        queue = self._urgent or self._listed
        if queue:
            try:
                self.processes[index].stdin.write(json.dumps([queue[0]]) + "\n")
                self._in_flight[index] = entry_key(queue.popleft())
            except OSError:  # the process has ended: the entry waits for another
                pass
        self._share_cores()

    def _share_cores(self) -> None:
        """Under the lock: one thread in this process while others compile, the thread
        count it had once they are idle.  Its parallel loops would otherwise wait for
        threads descheduled behind a compile (``threads.py``), and the cores are better
        spent compiling: every kernel compiled makes the steps faster.  (Not before the
        pools are set up: setting them up compiles, which would call back here.)"""
        if not threads.configured():
            return
        if self._in_flight and self._threads_before is None:
            self._threads_before = threads.get_num_threads()
            threads.set_num_threads(1)
        elif not self._in_flight and self._threads_before is not None:
            threads.set_num_threads(self._threads_before)
            self._threads_before = None

    def _read_compiled(self, index: int) -> None:
        for line in self.processes[index].stdout:
            with self._lock:
                self._compiled.add(line.rstrip("\n"))
                self._hand_next(index)
        with self._lock:
            self._in_flight.pop(index, None)
            self._share_cores()

    def pending(self) -> bool:
        """Whether the processes run and have not compiled everything listed or asked for."""
        if not self._running():
            return False
        with self._lock:
            return bool(self._urgent or self._listed or self._in_flight)

    def __exit__(self, *exc: Any) -> None:
        from numba.core import event

        event.unregister("numba:compile", self._listener)
        deferral.compiler = None
        kernel_cache.notice = self._notice
        for process in self.processes:
            if process.poll() is None:
                process.terminate()  # Numba writes each cache file whole, so stopping is safe
            process.wait()
            process.stdin.close()
        with self._lock:
            self._in_flight.clear()
            self._share_cores()


def serve(requests: Any, report: Any) -> list[str]:
    """A compiling process's work: each line of ``requests`` is a JSON list of entries;
    compile them in order, printing each one's ``entry_key`` to ``report`` when done.
    Returns the lines of ``compile_entry`` failures."""
    failed: list[str] = []
    for line in requests:
        for entry in json.loads(line):
            failure = compile_entry(entry)
            if failure is not None:
                failed.append(failure)
            print(entry_key(entry), file=report, flush=True)
    return failed


def main(argv: list[str]) -> int:
    """``python -m tensorcore.backends.numba.warmup < LIST.json``: compile the kernels of
    each line (a JSON list), in order, into Numba's cache, printing each one's key when
    it is done (``serve``)."""
    if argv:
        print("usage: python -m tensorcore.backends.numba.warmup < LIST.json", file=sys.stderr)
        return 2
    failed = serve(sys.stdin, sys.stdout)
    if failed:
        print(f"tensorcore: {len(failed)} kernels did not compile in the background "
              f"(the run compiles what it needs itself), the first: {failed[0]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
