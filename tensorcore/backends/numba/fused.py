"""Fused elementwise programs as generated ``@njit`` loops.

``fused_elementwise(program, inputs)`` (``backends/fused_program.py``) becomes one
loop nest over the output: every input is broadcast to the output's shape, the
dimensions that are contiguous in every array are merged (a same-shape chain is one
flat loop, a bias broadcast two), and the loop body evaluates the program on scalars,
in each register's dtype.  Inputs contiguous along the innermost loop are read from
flat buffers (so the loop vectorises), inputs broadcast along it once per row.  The
source is generated from the program's op names and numbers alone (through the fixed
tables below), once per program and loop layout.

Numerics: the body is compiled without fast-math, so ``+ - * /``, comparisons,
``where``, ``maximum``/``minimum``, ``neg``/``abs``/``sign``, ``sqrt``/``rsqrt``,
``floor``/``ceil``/``round`` and the activations (the same ``act_value`` the eager
kernels call, with their options) give the eager results bit for bit.  ``exp``,
``log``, ``tanh``, ``erf``, ``pow`` and the other libm functions may differ from
NumPy's vectorised versions in the last float32 bit, so the fusion pass leaves them
out on this backend (``fused_unary`` / ``fused_binary``); a program that has them
still runs, within a float32 ulp or two.

Cache: the source is written to ``<TENSORCORE_CACHE_DIR>/kernels/numba/<fingerprint of
the kernel sources>/fused_<hash of the source>.py`` (``kernel_cache.fused_dir``: the
helpers a generated loop inlines are part of the directory's name) and compiled, under
that file name, with ``cache=True``, so Numba keeps the machine code beside it and a new
process loads it (the text that runs is always the generated one, never the file's).
Where that directory cannot be written, the kernel is compiled in memory.
A loop over fewer than ``SERIAL_BELOW`` elements runs serially, larger ones in parallel.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import sys
import types
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ... import settings
from ...atomic import write_atomic
from .. import fused_program
from . import kernel_cache, threads
from .kernels.fused_ops import ACT_CODES

log = logging.getLogger("tensorcore.compile")

Array = Any

_UNARY = {
    "neg": "(-{0})", "abs": "abs({0})", "sign": "({O} if {0} > {Z} else (-{O} if {0} < {Z} else {0}))",
    "exp": "math.exp({0})", "log": "math.log({0})", "log1p": "math.log1p({0})", "sqrt": "math.sqrt({0})",
    "rsqrt": "({O} / math.sqrt({0}))", "sin": "math.sin({0})", "cos": "math.cos({0})",
    "tanh": "math.tanh({0})", "erf": "math.erf({0})",
    "softplus": "({0} + {L} if {0} == {Z} else ({0} + math.log1p(math.exp(-{0})) if {0} > {Z} "
                "else (math.log1p(math.exp({0})) if {0} <= {Z} else {0})))",
    "floor": "np.floor({0})", "ceil": "np.ceil({0})", "round": "np.rint({0})",
    "logical_not": "(not {0})", "isnan": "math.isnan({0})", "isinf": "math.isinf({0})",
}
_UNARY.update({name: f"activation({ACT_CODES[name]}, {{0}})"
               for name in ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")})
_BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "pow": "({0} ** {1})", "maximum": "({0} if ({0} >= {1} or {0} != {0}) else {1})",
    "minimum": "({0} if ({0} <= {1} or {0} != {0}) else {1})", "eq": "({0} == {1})", "ne": "({0} != {1})",
    "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})",
    "logical_and": "({0} and {1})", "logical_or": "({0} or {1})",
}
_JIT = 'error_model="numpy", cache={cache}'


def source(program: tuple, layout: str) -> str:
    """The Python source of the kernels for ``program``: ``serial(lo, hi, out, ...)``
    runs rows [lo, hi) of the outermost loop, ``parallel`` splits them over threads;
    ``layout`` ("o" per outer loop dimension, ":", then one letter per input) says how
    each input is read along the innermost loop -- ``c`` contiguous and ``b`` broadcast
    (a flat buffer indexed with the outer element strides, passed after it), ``g`` any
    other layout (a strided view with the output's shape)."""
    kinds = fused_program.check(program)
    n_in = len(program[0])
    outer, layout = layout.split(":") if ":" in layout else ("", layout)
    rank = len(outer) + 1
    if len(layout) != n_in or set(layout) - set("cbg") or set(outer) - {"o"}:
        raise ValueError(f"fused_elementwise: bad loop layout {layout!r}")
    constants = [f"{t}_{name} = np.{name}({value})" for name in fused_program.FLOATS
                 for t, value in (("Z", "0.0"), ("O", "1.0"), ("L", "math.log(2.0)"))]
    # rows [lo, hi) of the outermost loop; one dimension: a slice of the flat loop
    index = [f"i{d}" for d in range(rank - 1)]
    last = f"i{rank - 1}"
    width = "hi - lo" if rank == 1 else f"out.shape[{rank - 1}]"
    rows = [f"o = out[{', '.join(index)}]" if index else "o = out[lo:hi]"]
    body, params = [], ["lo", "hi", "out"]
    for k, how in enumerate(layout):
        params.append(f"a{k}")
        if how == "g":
            rows.append(f"v{k} = a{k}[{', '.join(index)}]" if index else f"v{k} = a{k}[lo:hi]")
            body.append(f"r{k} = v{k}[{last}]")
            continue
        params += [f"s{k}_{d}" for d in range(rank - 1)]
        offset = " + ".join(f"i{d} * s{k}_{d}" for d in range(rank - 1)) or "lo"
        if how == "c":  # a contiguous slice: indexed by the loop variable, the loop vectorises
            rows.append(f"w{k} = a{k}[{offset}:{offset} + {width}]")
            body.append(f"r{k} = w{k}[{last}]")
        else:  # one value per row: read before the row's loop
            rows.append(f"r{k} = a{k}[{offset if rank > 1 else 0}]")
    for i, ins in enumerate(program[1]):
        reg = n_in + i
        kind = ins[0]
        if kind == "const":
            value = repr(ins[2]) if ins[1] == "bool" else f"np.{ins[1]}({fused_program.literal(ins[2])})"
            constants.append(f"K{reg} = {value}")
            body.append(f"r{reg} = K{reg}")
            continue
        if kind == "where":
            expr = "({1} if {0} else {2})".format(*(f"r{r}" for r in ins[1:]))
        else:
            if kind == "act":
                template = f"activation({ACT_CODES[ins[1]]}, {{0}})"
            else:
                template = (_BINARY if kind == "binary" else _UNARY)[ins[1]]
            dtype = kinds[ins[2]]
            expr = template.format(*(f"r{r}" for r in ins[2:]), Z=f"Z_{dtype}", O=f"O_{dtype}", L=f"L_{dtype}")
        body.append(f"r{reg} = {expr}")
    body.append(f"o[{last}] = r{len(kinds) - 1}")
    lines = ['"""A fused elementwise kernel generated by tensorcore.backends.numba.fused."""',
             "import math", "import numpy as np", "from numba import njit",
             "from tensorcore.backends.numba.kernels.fused_ops import activation",
             "from tensorcore.backends.numba.kernels.parallel import parallel_for",
             "", *constants, ""]
    lines += ["", f"@njit({_JIT})", f"def serial({', '.join(params)}):"]
    for d in range(rank):
        if d == rank - 1:
            lines += ["    " * (d + 1) + line for line in rows]
        extent = width if d == rank - 1 else ("lo, hi" if d == 0 else f"out.shape[{d}]")
        lines.append("    " * (d + 1) + f"for i{d} in range({extent}):")
    lines += ["    " * (rank + 1) + line for line in body]
    rest = ", ".join(params[2:])
    lines += ["", "", f"@njit({_JIT})", f"def chunk(c, chunks, lo, hi, {rest}):",
              f"    serial(lo + c * (hi - lo) // chunks, lo + (c + 1) * (hi - lo) // chunks, {rest})",
              "", "", f"@njit({_JIT})", f"def parallel({', '.join(params)}):",
              "    chunks = min(hi - lo, 256)",
              f"    parallel_for(chunk, chunks, (chunks, lo, hi, {rest}))"]
    return "\n".join(lines) + "\n"


_ORIGINS: dict[str, tuple[tuple, str]] = {}  # generated module name -> (program, layout)


def origin(module_name: str) -> tuple[tuple, str] | None:
    """(program, layout) of the generated module ``module_name`` (a cached kernel's
    ``py_func.__module__``), or None for any other module: what ``numba/warmup.py``
    lists so that another process can generate and compile the same kernel."""
    return _ORIGINS.get(module_name)


@functools.lru_cache(maxsize=256)
def kernels(program: tuple, layout: str) -> tuple[Callable, Callable]:
    """(serial, parallel) compiled kernels of ``program`` for a loop ``layout`` (``source``)."""
    text = source(program, layout)
    digest = _digest(text)
    if settings.debug_level >= 2:
        print(f"[tensorcore] generated fused kernel {digest}\n{text}")
    module = load_module(kernel_cache.fused_dir() / f"fused_{digest}.py", text.replace("{cache}", "True"),
                         f"tensorcore_fused_{digest}")
    if module is None:
        namespace: dict[str, Any] = {}
        exec(compile(text.replace("{cache}", "False"), f"<fused {digest}>", "exec"), namespace)  # noqa: S102
        return namespace["serial"], namespace["parallel"]
    _ORIGINS[module.__name__] = (program, layout)
    return module.serial, module.parallel


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load_module(path: Path, text: str, name: str, namespace: dict[str, Any] | None = None) -> Any:
    """A module ``name`` running ``text`` as if imported from ``path``, so Numba's cache
    lives beside it (the file is written atomically when missing or different; what runs
    is ``text`` itself, never the file's content), or None when ``path`` cannot be used.
    ``namespace``: globals the text uses, set before it runs."""
    try:
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text.encode())
    except OSError as exc:
        log.debug("fused kernel compiled in memory (%s)", exc)
        return None
    module = types.ModuleType(name)
    module.__dict__.update(namespace or {})
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    exec(compile(text, str(path), "exec"), module.__dict__)  # noqa: S102  (generated from op names and numbers)
    return module


def loop_call(program: tuple, inputs: Sequence[Array], out: Array) -> tuple[str, Any, tuple, bool]:
    """How ``bind`` runs ``program`` on ``inputs`` into the C-contiguous, non-empty ``out``:
    (the kernel's name, "fused_<digest>_serial" or "_parallel", the kernel, its
    arguments, whether it is the parallel one, to be sized as ``threads.SizedKernel``
    sizes it), every view and check made once."""
    broadcast = [np.broadcast_to(a, out.shape) for a in inputs]
    dims, strides = fused_program.collapse(out.shape, [out.strides] + [a.strides for a in broadcast])
    args: list[Any] = [as_strided(out, dims, strides[0])]
    layout = ""
    for a, st in zip(broadcast, strides[1:]):
        view = as_strided(a, dims, st, writeable=False)
        item = a.dtype.itemsize
        elements = [s // item for s in st]
        if all(s >= 0 and s % item == 0 for s in st) and elements[-1] in (0, 1):
            extent = 1 + sum((n - 1) * e for n, e in zip(dims, elements))
            layout += "c" if elements[-1] else "b"
            args += [as_strided(view, (extent,), (item,), writeable=False), *elements[:-1]]
        else:
            layout += "g"
            args.append(view)
    layout = "o" * (len(dims) - 1) + ":" + layout
    serial, parallel = kernels(program, layout)
    digest = _digest(source(program, layout))[:16]
    if out.size < threads.SERIAL_BELOW:
        return f"fused_{digest}_serial", serial, (0, dims[0], *args), False
    return f"fused_{digest}_parallel", parallel, (0, dims[0], *args), True


def bind(program: tuple, inputs: Sequence[Array], out: Array) -> Callable[[], Any]:
    """A call running ``program`` on ``inputs`` into the C-contiguous ``out``, every
    view and check made once."""
    if out.size == 0:
        return lambda: None
    _, kernel, args, sized = loop_call(program, inputs, out)
    return functools.partial(threads.SizedKernel(kernel) if sized else kernel, *args)


class NumbaFusedKernels:
    """``fused_elementwise`` as a generated loop.  ``fused_unary`` / ``fused_binary``
    are the ops the fusion pass may hand it: those it computes bit for bit as the eager
    calls (not the libm functions, whose last bit may differ from NumPy's)."""

    fused_unary = frozenset(fused_program.UNARY) - {"exp", "log", "log1p", "sin", "cos", "tanh", "erf", "softplus"}
    fused_binary = frozenset(fused_program.BINARY) - {"pow"}

    def fused_elementwise(self, program: tuple, inputs: Sequence[Array]) -> Array:
        kinds = fused_program.check(program, [a.dtype.name for a in inputs])
        out = np.empty(np.broadcast_shapes(*[a.shape for a in inputs]), kinds[-1])
        bind(program, inputs, out)()
        return out

    def _bind_fused_program(self, op: str, args: tuple, kwargs: dict, out: Array) -> Any:
        """A fused program's generated loop bound to its arrays and ``out``, or None for
        other calls."""
        if op == "fused_elementwise" and not kwargs and out is not None and out.flags.c_contiguous:
            fused_program.check(args[0], [a.dtype.name for a in args[1]])
            return bind(args[0], args[1], out)
        return None
