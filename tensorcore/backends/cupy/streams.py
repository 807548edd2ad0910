"""A CUDA stream of its own for asynchronous compiled calls (``compile/asynchronous.py``).

Calls launched on it are ordered after what the caller queued on its current stream,
and each launch can be followed by an event whose ``done`` the event loop polls, so the
host never blocks in a synchronize.
"""

from __future__ import annotations

from typing import Any

import cupy


class AsyncStream:
    """A non-blocking stream: ``follow_current`` orders it after the caller's stream,
    ``launching()`` makes it current for the calls in the ``with`` block, ``record``
    marks the point reached with an event (its ``done`` says whether the work before
    it has finished)."""

    def __init__(self) -> None:
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def follow_current(self) -> None:
        """Make later launches here wait for what the current stream has queued so far."""
        self.stream.wait_event(_record(cupy.cuda.get_current_stream()))

    def launching(self) -> Any:
        """A context manager under which this stream is the current one."""
        return self.stream

    def record(self) -> Any:
        """An event after everything queued here so far."""
        return _record(self.stream)


def _record(stream: Any) -> Any:
    event = cupy.cuda.Event(disable_timing=True)
    event.record(stream)
    return event
