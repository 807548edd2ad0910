"""CUDA C source of fused elementwise programs (imports no CuPy: CI compiles it with nvcc).

``source(program, rank)`` is the project's ``elementwise.cu`` (with ``common.cuh``: the
``unary_op`` / ``binary_op`` / ``act_fwd`` device functions the eager kernels use),
followed by one generated ``extern "C"`` kernel ``fused_elementwise``: a grid-stride
loop over the output's elements, each split into ``rank`` loop coordinates, every
input read through its own element strides (0 along broadcast dimensions), the
program evaluated in registers and the result stored.  The generated part is made
from the program's op names, looked up in the fixed tables below, and its numbers,
written as bit patterns; nothing else enters it.

Bound: memory.  Launch: 1-D, 256 threads per block, grid capped at a few blocks per SM.
Numerics: ``+ - *`` are written with the round-to-nearest intrinsics, which the compiler
never contracts into a multiply-add, and the other ops call the eager kernels' own
device functions, each result passed through an empty ``asm`` so no multiply-add is
contracted across two ops either: a chain rounds after each op as the separate eager
kernels do.
"""

from __future__ import annotations

import struct

from .. import fused_program
from . import loader

C_TYPES = {"float32": "float", "float64": "double", "bool": "bool"}
UNARY_CODES = {name: f"U_{name.upper()}" for name in fused_program.UNARY_FLOAT}  # enum Unary
_UNARY_OTHER = {"logical_not": "(!{0})", "isnan": "({0} != {0})", "isinf": "({0} == {0} && {0} - {0} != {0} - {0})"}
_ROUNDED = {("add", "float32"): "__fadd_rn", ("sub", "float32"): "__fsub_rn", ("mul", "float32"): "__fmul_rn",
            ("add", "float64"): "__dadd_rn", ("sub", "float64"): "__dsub_rn", ("mul", "float64"): "__dmul_rn"}
_BINARY_CODES = {"div": "B_DIV", "pow": "B_POW", "maximum": "B_MAXIMUM", "minimum": "B_MINIMUM"}  # enum Binary
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "logical_and": "&&",
            "logical_or": "||"}
NAME = "fused_elementwise"


def constant(dtype: str, number: bool | int | float) -> str:
    """A constant as a C expression of its exact bits."""
    if dtype == "bool":
        return "true" if number else "false"
    value = fused_program.const_value(dtype, number)
    if dtype == "float32":
        return f"__int_as_float((int)0x{struct.unpack('<I', struct.pack('<f', value))[0]:08x}u)"
    return f"__longlong_as_double((long long)0x{struct.unpack('<Q', struct.pack('<d', value))[0]:016x}ull)"


def kernel_source(program: tuple, rank: int) -> str:
    """The generated kernel alone (it needs the prelude of ``source``)."""
    kinds = fused_program.check(program)
    n_in = len(program[0])
    if not isinstance(rank, int) or not 1 <= rank <= 16:
        raise ValueError(f"fused_elementwise: bad loop rank {rank!r}")
    params = [f"const {C_TYPES[d]}* __restrict__ a{k}" for k, d in enumerate(program[0])]
    params += [f"{C_TYPES[kinds[-1]]}* __restrict__ out", "long long n"]
    params += [f"long long d{j}" for j in range(1, rank)]
    params += [f"long long s{k}_{j}" for k in range(n_in) for j in range(rank)]
    body = ["long long rest = i;"]
    for j in range(rank - 1, 0, -1):
        body.append(f"const long long c{j} = divmod_index(rest, d{j}, narrow);")
    body.append("const long long c0 = rest;")
    for k, d in enumerate(program[0]):
        offset = " + ".join(f"c{j} * s{k}_{j}" for j in range(rank))
        body.append(f"const {C_TYPES[d]} r{k} = a{k}[{offset}];")
    for i, ins in enumerate(program[1]):
        reg, kind = n_in + i, ins[0]
        regs = [f"r{r}" for r in ins[2:]] if kind in ("unary", "act", "binary") else [f"r{r}" for r in ins[1:]]
        if kind == "const":
            expr = constant(ins[1], ins[2])
        elif kind == "where":
            expr = f"({regs[0]} ? {regs[1]} : {regs[2]})"
        elif kind == "act":
            expr = f"act_fwd(ACT_{ins[1].upper()}, {regs[0]})"
        elif kind == "unary":
            expr = (f"unary_op({UNARY_CODES[ins[1]]}, {regs[0]})" if ins[1] in UNARY_CODES
                    else _UNARY_OTHER[ins[1]].format(regs[0]))
        else:
            op, dtype = ins[1], kinds[ins[2]]
            if (op, dtype) in _ROUNDED:
                expr = f"{_ROUNDED[op, dtype]}({regs[0]}, {regs[1]})"
            elif op in _BINARY_CODES:
                expr = f"binary_op({_BINARY_CODES[op]}, {regs[0]}, {regs[1]})"
            else:
                expr = f"({regs[0]} {_COMPARE[op]} {regs[1]})"
        ctype = C_TYPES[kinds[reg]]
        if ctype != "bool" and expr.startswith(("unary_op", "act_fwd", "binary_op")):
            # an opaque move: the compiler cannot contract a multiply-add across two ops
            body.append(f"{ctype} r{reg} = {expr};")
            body.append(f'asm volatile("" : "+{ctype[0]}"(r{reg}));')
        else:
            body.append(f"const {ctype} r{reg} = {expr};")
    body.append(f"out[i] = r{len(kinds) - 1};")
    inner = "\n".join("        " + line for line in body)
    return (f'extern "C" __global__ void {NAME}(\n    ' + ",\n    ".join(params) + ") {\n"
            "    const long long step = (long long)gridDim.x * blockDim.x;\n"
            "    const bool narrow = n < (1LL << 31);\n"
            "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {\n"
            f"{inner}\n    }}\n}}\n")


def source(program: tuple, rank: int) -> str:
    """The full source NVRTC compiles: the eager elementwise kernels' source, then the
    generated kernel."""
    return f"{loader.source('elementwise.cu')}\n// ----- generated: fused elementwise program -----\n" \
           f"{kernel_source(program, rank)}"
