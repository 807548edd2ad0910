"""Compiled calls under asyncio: ``await compiled.call_async(...)`` and ``await chain.call_async(...)``.

A ``Lane`` is where one compiled callable (or one chain) runs its asynchronous calls,
in the order they were made:

* **CuPy**: a non-blocking CUDA stream of its own (the backend's ``async_stream()``).  Each call (a plan replay, a trace or
  an eager fallback alike) is launched on that stream from the event loop's thread,
  ordered after the caller's current stream so inputs made there are ready; the
  coroutine then polls an event recorded after the call, yielding to the event loop
  between polls -- the host never blocks in a synchronize, so it can prepare the next
  call while the GPU finishes this one.  Stages of a chain are queued back to back:
  stage k+1 is launched before stage k's event is awaited.
* **CPU** (NumPy, Numba): one worker thread per lane, so the event loop stays
  responsive and calls of one compiled callable run one after another.  The caller's
  grad mode travels with the call.

Cancellation lands at plan boundaries: a plan in flight always completes (a replay is
never stopped half-way, so the callable's buffers, state and counters stay as a
finished call leaves them), no later plan of the call starts, and ``CancelledError`` is
raised once the work already launched is done.  A call cancelled before it started
runs nothing.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

from ..autograd import is_grad_enabled, set_grad_enabled
from ..backends import backend_for, default_device_name
from ..tensor import Tensor
from .graph import leaves

SPIN_SECONDS = 0.002  # poll a CUDA event with sleep(0) this long (a short tail costs no timer wake-up) ...
POLL_SECONDS = 0.0002  # ... then sleep this long between polls (a long call leaves the loop idle)

Stage = Callable[..., Any]


async def wait_event(event: Any) -> None:
    """Yield to the event loop until the CUDA ``event`` has completed (never blocks)."""
    start = time.perf_counter()
    while not event.done:
        await asyncio.sleep(0 if time.perf_counter() - start < SPIN_SECONDS else POLL_SECONDS)


async def _settle(future: asyncio.Future, pending: Future | None = None) -> Any:
    """The result of ``future`` (work already launched); a cancellation first withdraws
    ``pending`` if it has not started, else waits for the work to finish, then propagates."""
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if pending is None or not pending.cancel():
            await asyncio.wait([future])
            if not future.cancelled():
                future.exception()  # retrieved: a failure after the cancellation is not logged as lost
        raise


def call_device(args: tuple, kwargs: dict) -> str:
    """The device a call runs on: its first tensor argument's, else the default device."""
    for leaf in leaves((args, kwargs)):
        if isinstance(leaf, Tensor):
            return leaf.device
    return default_device_name()


class Lane:
    """An ordered place to run calls off the event loop: a CUDA stream or one worker thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._stream: Any = None

    async def run(self, stages: Sequence[Stage], args: tuple, device: str) -> Any:
        """``stages[-1](...stages[1](stages[0](*args)))`` on ``device``; cancellable between stages."""
        stream = self._stream_for(device)
        if stream is not None:
            return await self._on_stream(stream, stages, args)
        out: Any = args
        for i, stage in enumerate(stages):
            out = await self._in_worker(stage, out if i == 0 else (out,))
        return out

    # ----- CPU: one worker thread --------------------------------------------------------
    async def _in_worker(self, stage: Stage, args: tuple) -> Any:
        grad = is_grad_enabled()

        def call() -> Any:
            with set_grad_enabled(grad):
                return stage(*args)

        pending = self._worker().submit(call)
        return await _settle(asyncio.wrap_future(pending), pending)

    def _worker(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tc-async-{self.name}")
            return self._executor

    # ----- GPU: a stream and event polling --------------------------------------------------
    async def _on_stream(self, stream: Any, stages: Sequence[Stage], args: tuple) -> Any:
        stream.follow_current()  # the inputs are ready
        out: Any = args
        previous = None
        try:
            for i, stage in enumerate(stages):
                with stream.launching():
                    out = stage(*out) if i == 0 else stage(out)
                launched = stream.record()
                if previous is not None:  # stage i is queued; wait for stage i - 1
                    await wait_event(previous)
                previous = launched
            await wait_event(previous)
        except asyncio.CancelledError:
            await _settle(asyncio.ensure_future(wait_event(stream.record())))  # what was queued ends
            raise
        return out

    def _stream_for(self, device: str) -> Any:
        """The lane's stream on ``device``'s backend, made on first use; None where the
        backend has none (the CPU: calls run on the worker thread)."""
        with self._lock:
            if self._stream is None:
                self._stream = backend_for(device.split(":")[0]).async_stream()
            return self._stream

    def close(self) -> None:
        """Let the worker thread end (queued calls still run)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)


_lanes: "weakref.WeakKeyDictionary[Any, Lane]" = weakref.WeakKeyDictionary()
_lanes_lock = threading.Lock()


def lane(owner: Any) -> Lane:
    """``owner``'s lane (a compiled callable's or a chain's), made on first use and
    closed when ``owner`` is collected."""
    with _lanes_lock:
        found = _lanes.get(owner)
        if found is None:
            found = _lanes[owner] = Lane(type(owner).__name__.lower())
            weakref.finalize(owner, found.close)
        return found
