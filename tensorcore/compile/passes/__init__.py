"""Graph passes: each is a pure function ``Graph -> Graph`` with its own tests.

``tc.compile(..., passes=None)`` runs ``DEFAULT``; ``passes`` may list pass names (keys
of ``PASSES``) and/or callables taking and returning a Graph, run in order.
"""

from __future__ import annotations

from typing import Callable, Iterable

from ..graph import Graph
from .dce import dead_code_elimination

Pass = Callable[[Graph], Graph]

PASSES: dict[str, Pass] = {"dce": dead_code_elimination}
DEFAULT: tuple[str, ...] = ("dce",)


def resolve(passes: Iterable[str | Pass] | None) -> tuple[Pass, ...]:
    """The pass functions named or given by ``passes`` (None: the default pipeline)."""
    if passes is None:
        passes = DEFAULT
    if isinstance(passes, str) or not isinstance(passes, Iterable):
        raise TypeError(f"compile: passes must be a list of pass names or callables, got {passes!r}")
    resolved = []
    for p in passes:
        if callable(p):
            resolved.append(p)
        elif p in PASSES:
            resolved.append(PASSES[p])
        else:
            raise ValueError(f"compile: unknown pass {p!r}; known passes: {', '.join(sorted(PASSES))}")
    return tuple(resolved)


def run(graph: Graph, passes: tuple[Pass, ...]) -> Graph:
    """Apply each pass in order."""
    for p in passes:
        graph = p(graph)
        if not isinstance(graph, Graph):
            raise TypeError(f"compile: pass {getattr(p, '__name__', p)!r} returned {type(graph).__name__}, not a Graph")
    return graph
