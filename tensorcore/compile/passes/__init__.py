"""Graph passes: each is a pure function ``Graph -> Graph`` with its own tests.

``tc.compile(..., passes=None)`` runs ``DEFAULT``.  ``passes`` may be a list of pass
names (keys of ``PASSES``) and/or callables taking and returning a Graph, run in order,
or a dict of switches over the default pipeline (``{"fuse_elementwise": False}``).
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable, Mapping

from ..graph import Graph
from .cse import common_subexpression_elimination
from .dce import dead_code_elimination
from .fuse_attention import fuse_attention
from .fuse_elementwise import fuse_elementwise
from .fuse_epilogue import fuse_epilogue
from .fuse_gate_bias import fuse_gate_bias
from .fuse_norm import fuse_norm
from .fuse_norm_conv import fuse_norm_conv
from .fuse_upsample_conv import fuse_upsample_conv
from .group_linear import group_linear
from .lora import lora
from .place_concat import place_concat

Pass = Callable[[Graph], Graph]

PASSES: dict[str, Pass] = {"dce": dead_code_elimination, "cse": common_subexpression_elimination,
                           "fuse_attention": fuse_attention, "lora": lora, "fuse_epilogue": fuse_epilogue,
                           "fuse_gate_bias": fuse_gate_bias,
                           "fuse_norm": fuse_norm, "fuse_norm_conv": fuse_norm_conv,
                           "fuse_upsample_conv": fuse_upsample_conv,
                           "group_linear": group_linear, "fuse_elementwise": fuse_elementwise,
                           "place_concat": place_concat}
# Pattern rewrites first (the LoRA pattern needs the base's matmul and bias add as they
# were traced), then epilogue fusion, a gate taking its projection's bias (which epilogue
# fusion put in the product), norm fusion, then a norm folded whole into the conv
# after it (with the conv's epilogue and the norm's activation and shift already in),
# and an upsampling folded into the conv that reads it,
# then the few-row products of one input grouped into one call (after epilogue fusion
# has made them), then elementwise fusion, which would otherwise take the adds and
# scalings the others fold; last, concatenations placed in memory (which changes the
# "block of its own" the others look for).
DEFAULT: tuple[str, ...] = ("dce", "cse", "fuse_attention", "lora", "fuse_epilogue", "fuse_gate_bias", "fuse_norm",
                            "fuse_norm_conv", "fuse_upsample_conv", "group_linear", "fuse_elementwise", "place_concat")


def resolve(passes: Iterable[str | Pass] | Mapping[str, bool] | None) -> tuple[Pass, ...]:
    """The pass functions named or given by ``passes`` (None: the default pipeline; a
    dict: the default pipeline with each named pass switched on or off)."""
    if passes is None:
        passes = DEFAULT
    if isinstance(passes, Mapping):
        passes = _switched(passes)
    if isinstance(passes, str) or not isinstance(passes, Iterable):
        raise TypeError(f"compile: passes must be a list of pass names or callables, or a dict of "
                        f"switches, got {passes!r}")
    resolved = []
    for p in passes:
        if callable(p):
            resolved.append(p)
        elif p in PASSES:
            resolved.append(PASSES[p])
        else:
            raise ValueError(f"compile: unknown pass {p!r}; known passes: {', '.join(sorted(PASSES))}")
    return tuple(resolved)


def _switched(switches: Mapping[str, bool]) -> list[str]:
    """The default pipeline with passes switched on (appended in ``PASSES`` order when
    not in it) or off."""
    for name, on in switches.items():
        if name not in PASSES:
            raise ValueError(f"compile: unknown pass {name!r} in passes; known passes: {', '.join(sorted(PASSES))}")
        if not isinstance(on, bool):
            raise TypeError(f"compile: passes[{name!r}] must be True or False, got {on!r}")
    chosen = [name for name in DEFAULT if switches.get(name, True)]
    return chosen + [name for name in PASSES if switches.get(name) and name not in chosen]


def signature(passes: tuple[Pass, ...]) -> str:
    """A name for the pipeline, part of the disk cache's model identity: a plan made by
    other passes is another plan.  Callables are named by module, name and code."""
    names = {fn: name for name, fn in PASSES.items()}
    parts = []
    for p in passes:
        if p in names:
            parts.append(names[p])
        else:
            code = getattr(p, "__code__", None)
            digest = hashlib.sha256(code.co_code).hexdigest()[:16] if code is not None else "opaque"
            parts.append(f"{getattr(p, '__module__', '?')}.{getattr(p, '__qualname__', type(p).__name__)}:{digest}")
    return ",".join(parts)


def run(graph: Graph, passes: tuple[Pass, ...]) -> Graph:
    """Apply each pass in order."""
    for p in passes:
        graph = p(graph)
        if not isinstance(graph, Graph):
            raise TypeError(f"compile: pass {getattr(p, '__name__', p)!r} returned {type(graph).__name__}, not a Graph")
    return graph
