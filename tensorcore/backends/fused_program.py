"""Fused elementwise programs: the plain-data form of a chain of elementwise ops.

The elementwise fusion pass of ``tc.compile`` turns a chain of unary / binary / where /
bias + activation calls into one call ``backend.fused_elementwise(program, inputs)``.
A program is nested tuples of op names and numbers only, so it is stored in the plan
cache as JSON and kernels are generated from it without any user text:

    program = (input_dtypes, code)
    input_dtypes: one dtype name per input array ("float32" | "float64" | "bool")
    code: instructions, each appending one register (registers 0.. are the inputs):
        ("const", dtype, number)      a number in ``dtype`` (a Python float, int or bool)
        ("unary", op, r)              backend.unary(op, r)
        ("act", act, r)               the activation bias_act applies (ACTIVATIONS)
        ("binary", op, r, s)          backend.binary(op, r, s); r and s of one dtype
        ("where", c, r, s)            backend.where(c, r, s); c bool, r and s of one dtype

The last register is the result; its shape is the broadcast of the inputs' shapes.
``check`` validates a program (one loaded from a file included) and returns the dtype
of every register; ``UNARY`` / ``BINARY`` list what a program may use.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from . import opcodes
from .opcodes import ACTIVATIONS

DTYPES = ("float32", "float64", "bool")
FLOATS = ("float32", "float64")
UNARY_FLOAT = tuple(opcodes.UNARY_CODES)  # the unary ops of the elementwise kernels
UNARY_TEST = ("isnan", "isinf")  # float -> bool
UNARY = UNARY_FLOAT + UNARY_TEST + ("logical_not",)
ARITHMETIC = tuple(opcodes.BINARY_CODES)
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
LOGICAL = ("logical_and", "logical_or")
BINARY = ARITHMETIC + COMPARISONS + LOGICAL
ACTS = tuple(a for a in ACTIVATIONS if a != "none")
MAX_INPUTS = 16


def check(program: Any, input_dtypes: Sequence[str] | None = None) -> list[str]:
    """The dtype of every register of ``program``; ValueError naming the problem when it
    is not a valid program (or its inputs' dtypes are not ``input_dtypes``)."""
    if type(program) is not tuple or len(program) != 2 or type(program[0]) is not tuple \
            or type(program[1]) is not tuple or not program[1]:
        raise ValueError(f"fused_elementwise: a program is (input dtypes, code), got {str(program)[:80]}")
    declared, code = program
    if not 0 < len(declared) <= MAX_INPUTS or any(d not in DTYPES for d in declared):
        raise ValueError(f"fused_elementwise: bad input dtypes {declared!r} (1 to {MAX_INPUTS} of {DTYPES})")
    if input_dtypes is not None and tuple(input_dtypes) != declared:
        raise ValueError(f"fused_elementwise: inputs of dtypes {tuple(input_dtypes)} for a program "
                         f"compiled for {declared}")
    kinds = list(declared)
    for ins in code:
        kinds.append(_result(ins, kinds))
    return kinds


def _result(ins: Any, kinds: list[str]) -> str:
    """The dtype an instruction produces, after checking it."""
    def reg(r: Any) -> str:
        if type(r) is not int or not 0 <= r < len(kinds):
            raise ValueError(f"fused_elementwise: bad register {r!r} in {ins!r}")
        return kinds[r]

    if type(ins) is not tuple or not ins or type(ins[0]) is not str:
        raise ValueError(f"fused_elementwise: bad instruction {str(ins)[:60]}")
    kind, rest = ins[0], ins[1:]
    if kind == "const" and len(rest) == 2 and rest[0] in DTYPES and type(rest[1]) in (bool, int, float):
        if rest[0] != "bool" and type(rest[1]) is bool or rest[0] == "bool" and type(rest[1]) is not bool:
            raise ValueError(f"fused_elementwise: constant {rest[1]!r} is not a {rest[0]}")
        if type(rest[1]) is int and abs(rest[1]) > 2 ** 53:
            raise ValueError(f"fused_elementwise: constant {rest[1]!r} out of range")
        return rest[0]
    if kind == "unary" and len(rest) == 2 and rest[0] in UNARY:
        dtype = reg(rest[1])
        if rest[0] == "logical_not":
            return _need(dtype, ("bool",), ins)
        _need(dtype, FLOATS, ins)
        return "bool" if rest[0] in UNARY_TEST else dtype
    if kind == "act" and len(rest) == 2 and rest[0] in ACTS:
        return _need(reg(rest[1]), FLOATS, ins)
    if kind == "binary" and len(rest) == 3 and rest[0] in BINARY:
        a, b = reg(rest[1]), reg(rest[2])
        if a != b:
            raise ValueError(f"fused_elementwise: operands of {ins!r} have dtypes {a} and {b}")
        if rest[0] in ARITHMETIC:
            return _need(a, FLOATS, ins)
        if rest[0] in LOGICAL:
            return _need(a, ("bool",), ins)
        return "bool"
    if kind == "where" and len(rest) == 3:
        c, a, b = (reg(r) for r in rest)
        _need(c, ("bool",), ins)
        if a != b:
            raise ValueError(f"fused_elementwise: branches of {ins!r} have dtypes {a} and {b}")
        return a
    raise ValueError(f"fused_elementwise: bad instruction {str(ins)[:60]}")


def _need(dtype: str, allowed: tuple[str, ...], ins: Any) -> str:
    if dtype not in allowed:
        raise ValueError(f"fused_elementwise: {ins!r} takes {'/'.join(allowed)}, not {dtype}")
    return dtype


def const_value(dtype: str, number: bool | int | float) -> Any:
    """A constant as the NumPy scalar the eager call would have used."""
    import numpy

    with numpy.errstate(over="ignore"):
        return numpy.dtype(dtype).type(number)


def literal(number: float) -> str:
    """A float as Python source (``float('nan')`` and the infinities included)."""
    if math.isfinite(number):
        return repr(float(number))
    return f"float({repr(float(number))!r})"


def collapse(shape: tuple, strides: list[tuple]) -> tuple[tuple, list[tuple]]:
    """(dims, strides per array) of a loop over ``shape`` with the dimensions that are
    contiguous in every stride set merged and size-1 ones dropped (at least one left)."""
    merged: list[tuple[int, list[int]]] = []
    for d, size in enumerate(shape):
        if size == 1:
            continue
        st = [s[d] for s in strides]
        if merged and all(p == q * size for p, q in zip(merged[-1][1], st)):
            merged[-1] = (merged[-1][0] * size, st)
        else:
            merged.append((size, st))
    if not merged:
        merged = [(1, [0] * len(strides))]
    return tuple(m[0] for m in merged), [tuple(m[1][k] for m in merged) for k in range(len(strides))]
