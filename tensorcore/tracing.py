"""The one tracing hook code outside ``compile/`` may use (a leaf: imports nothing of tensorcore).

``tc.compile`` records a call once and replays the recorded backend calls afterwards,
so Python that runs beside the backend calls -- host-side bookkeeping, host-side
decisions -- runs only while tracing.  Stateful helpers (optimizers, an EMA, a
scheduler's host tables) talk to the tracer through three functions here:

* ``is_tracing()``: whether this thread is recording (a host check that reads a value
  skips then: a plan cannot depend on data);
* ``host_effect(effect)``: run ``effect`` now and again before every replay of the
  plan being recorded (host step counters mirroring device state);
* ``guard(predicate)``: the recording took a host-side decision that stays right only
  while ``predicate()`` holds; a replay checks it first and retraces when it fails.

The tracer (``compile/trace.py``) is the only ``Recorder``: it sets ``state.recorder``
for the thread it records in.
"""

from __future__ import annotations

import threading
from typing import Callable, Protocol


class Recorder(Protocol):
    """What a tracer offers the helpers above."""

    def add_effect(self, effect: Callable[[], None]) -> None:
        """Run ``effect`` now with backend calls unrecorded, and before every replay."""

    def add_guard(self, predicate: Callable[[], bool]) -> None:
        """Replay only while ``predicate()`` is true."""


class ThreadState(threading.local):
    """The recorder of the trace running in this thread, if any."""

    recorder: Recorder | None = None  # class default: threads that never traced


state = ThreadState()


def is_tracing() -> bool:
    """Whether this thread is recording a trace."""
    return state.recorder is not None


def host_effect(effect: Callable[[], None]) -> None:
    """Run ``effect`` now -- outside the recording when tracing -- and again before every
    replay of the current trace (the replay skips the Python that did it)."""
    recorder = state.recorder
    if recorder is None:
        effect()
    else:
        recorder.add_effect(effect)


def guard(predicate: Callable[[], bool]) -> None:
    """Declare that the current trace stays right only while ``predicate()`` is true
    (e.g. an optimizer's "first step" branch); a no-op when not tracing."""
    recorder = state.recorder
    if recorder is not None:
        recorder.add_guard(predicate)
