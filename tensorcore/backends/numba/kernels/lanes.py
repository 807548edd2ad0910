"""Sums over a contiguous row in a fixed order, in vector registers, without fast-math.

Kernels compile without fast-math (``jit.py``), so LLVM may not reorder a running sum
``s += row[i]``: such a loop adds one value at a time.  ``lane_sum`` writes the vector
loop itself (LLVM IR): four accumulators of ``lanes`` values each (16 float32 or 8
float64: one AVX-512 register), accumulator ``u`` adding the vector at ``i + u lanes`` of
every block of ``4 lanes`` values, so four vector additions are in flight.  Then the
accumulators are added ((0 + 1) + (2 + 3)), the full vectors after the last block are
added to that, its halves are added until one value is left (lane ``k`` plus lane
``k + lanes/2``...), and the values past the last full vector are added in order.
The order of every addition is fixed by this code, not by the optimiser, so every
compiled copy of a kernel gives the same bits.

``lane_sum(kind, x, y, m)`` sums one term per index ``i`` of the contiguous 1-D arrays
``x`` and ``y`` (``kind`` a compile-time constant; ``y`` and ``m`` are read only by the
terms that use them):

* ``SUM``: ``x[i]``;
* ``DOT``: ``x[i] * y[i]``;
* ``SQUARED_DEVIATION``: ``(x[i] - m) ** 2``;
* ``DOT_DEVIATION``: ``x[i] * (y[i] - m)``.

The sum, and ``m``, are in ``x``'s dtype (float32 or float64).  Arrays Numba cannot
prove contiguous take a scalar loop that adds in the same order.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import errors
from numba.extending import intrinsic, overload
from numba.np.numpy_support import as_dtype

from .jit import JIT_OPTIONS, allow_wide_vectors

SUM, DOT, SQUARED_DEVIATION, DOT_DEVIATION = range(4)
_READS_Y = (DOT, DOT_DEVIATION)
REGISTER_BYTES = 64
_ACCUMULATORS = 4  # vector adds in flight: an add's latency is ~4 cycles


def lane_sum(kind, x, y, m):
    """The sum over ``i`` of the ``kind`` term (see the module docstring); callable from
    jitted code only, with ``kind`` a compile-time constant."""


def _kind(kind) -> int:
    if not isinstance(kind, types.IntegerLiteral) or kind.literal_value not in range(4):
        raise errors.TypingError(f"lane_sum: the term must be a compile-time constant in 0..3, got {kind}")
    return kind.literal_value


def lane_count(dtype) -> int:
    """Values of ``dtype`` (a Numba float type) in one vector register."""
    return REGISTER_BYTES * 8 // dtype.bitwidth


def vector_type(context, builder, dtype) -> tuple[ir.VectorType, int]:
    """One vector register of the Numba float type ``dtype`` as an LLVM type, and the
    alignment its loads and stores may assume (one element's: rows start anywhere).
    The function being built may then keep such vectors in 512-bit registers
    (``jit.allow_wide_vectors``; otherwise LLVM splits each operation in two)."""
    allow_wide_vectors(builder.function)
    scalar = context.get_value_type(dtype)
    return ir.VectorType(scalar, lane_count(dtype)), context.get_abi_sizeof(scalar)


def splat(builder, vector: ir.VectorType, value):
    """``value`` in every lane of a ``vector``."""
    first = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(first, ir.Constant(vector, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), vector.count), [0] * vector.count))


def open_loop(builder, end, name: str, start=None):
    """Start ``for index in range(start, end, step)`` (``start`` an i64 value, 0 when
    None; the step given to ``close_loop``): returns (the block before it, the loop's
    block, the block after it, the index), the builder in the loop's block.  The loop
    is skipped when ``end`` <= ``start``."""
    i64 = ir.IntType(64)
    start = i64(0) if start is None else start
    before = builder.basic_block
    loop = builder.append_basic_block(f"{name}.loop")
    after = builder.append_basic_block(f"{name}.after")
    builder.cbranch(builder.icmp_signed("<", start, end), loop, after)
    builder.position_at_end(loop)
    index = builder.phi(i64)
    index.add_incoming(start, before)
    return before, loop, after, index


def close_loop(builder, index, step: int, end, loop, after):
    """End the loop ``open_loop`` started (add the loop's other phi incomings before):
    returns the next index, the builder in the block after the loop."""
    following = builder.add(index, ir.IntType(64)(step))
    index.add_incoming(following, loop)
    builder.cbranch(builder.icmp_signed("<", following, end), loop, after)
    builder.position_at_end(after)
    return following


def _vector_term(builder, kind: int, vx, vy, vm):
    if kind == SUM:
        return vx
    if kind == DOT:
        return builder.fmul(vx, vy)
    if kind == SQUARED_DEVIATION:
        d = builder.fsub(vx, vm)
        return builder.fmul(d, d)
    return builder.fmul(vx, builder.fsub(vy, vm))


def _loop(builder, load_term, first, end, accumulators):
    """Emit ``for i in range(first, end, len(accumulators) * lanes)``, accumulator ``u``
    adding the term of the vector at ``i + u * lanes``; returns (the index reached, the
    accumulators after the loop)."""
    vector = accumulators[0].type
    lanes, step = vector.count, vector.count * len(accumulators)
    i64 = ir.IntType(64)
    before = builder.basic_block
    loop = builder.append_basic_block("lanes.loop")
    after = builder.append_basic_block("lanes.after")
    builder.cbranch(builder.icmp_signed("<=", builder.add(first, i64(step)), end), loop, after)

    builder.position_at_end(loop)
    index = builder.phi(i64)
    index.add_incoming(first, before)
    phis = []
    for acc in accumulators:
        phi = builder.phi(vector)
        phi.add_incoming(acc, before)
        phis.append(phi)
    updated = [builder.fadd(phi, load_term(builder.add(index, i64(u * lanes)))) for u, phi in enumerate(phis)]
    following = builder.add(index, i64(step))
    index.add_incoming(following, loop)
    for phi, value in zip(phis, updated):
        phi.add_incoming(value, loop)
    builder.cbranch(builder.icmp_signed("<=", builder.add(following, i64(step)), end), loop, after)

    builder.position_at_end(after)
    reached = builder.phi(i64)
    reached.add_incoming(first, before)
    reached.add_incoming(following, loop)
    results = []
    for acc, value in zip(accumulators, updated):
        result = builder.phi(vector)
        result.add_incoming(acc, before)
        result.add_incoming(value, loop)
        results.append(result)
    return reached, results


def _halves(builder, value, width):
    """``value``'s first ``width`` lanes plus its next ``width``."""
    def pick(lanes):
        return builder.shuffle_vector(value, value, ir.Constant(ir.VectorType(ir.IntType(32), width), lanes))
    return builder.fadd(pick(list(range(width))), pick(list(range(width, 2 * width))))


@intrinsic
def _vector_part(typingctx, kind, x, y, m, body):
    """The sum of the terms at indices [0, body), ``body`` a multiple of the lane count,
    in the order of the module docstring."""
    code = _kind(kind)
    dtype = x.dtype

    def codegen(context, builder, signature, args):
        _, xv, yv, mv, count = args
        vector, align = vector_type(context, builder, dtype)
        lanes = vector.count
        x_data = context.make_array(x)(context, builder, xv).data
        y_data = context.make_array(y)(context, builder, yv).data if code in _READS_Y else x_data
        vm = splat(builder, vector, mv)

        def load_term(index):
            vx = builder.load(builder.bitcast(builder.gep(x_data, [index]), vector.as_pointer()), align=align)
            vy = vx
            if code in _READS_Y:
                vy = builder.load(builder.bitcast(builder.gep(y_data, [index]), vector.as_pointer()), align=align)
            return _vector_term(builder, code, vx, vy, vm)

        end = context.cast(builder, count, signature.args[4], types.int64)
        zero = ir.Constant(vector, [0.0] * lanes)
        reached, accs = _loop(builder, load_term, ir.Constant(ir.IntType(64), 0), end,
                              [zero] * _ACCUMULATORS)
        acc = builder.fadd(builder.fadd(accs[0], accs[1]), builder.fadd(accs[2], accs[3]))
        _, (acc,) = _loop(builder, load_term, reached, end, [acc])
        width = lanes
        while width > 1:  # lane k plus lane k + width/2, until one lane is left
            width //= 2
            acc = _halves(builder, acc, width)
        return builder.extract_element(acc, ir.Constant(ir.IntType(32), 0))

    return dtype(kind, x, y, m, body), codegen


def _scalar_term(kind, x, y, m, i):
    """The ``kind`` term at index ``i``; callable from jitted code only."""


@overload(_scalar_term, prefer_literal=True, inline="always", jit_options=JIT_OPTIONS)
def _scalar_term_impl(kind, x, y, m, i):
    code = _kind(kind)
    if code == SUM:
        return lambda kind, x, y, m, i: x[i]
    if code == DOT:
        return lambda kind, x, y, m, i: x[i] * y[i]
    if code == SQUARED_DEVIATION:
        def squared(kind, x, y, m, i):
            d = x[i] - m
            return d * d
        return squared
    return lambda kind, x, y, m, i: x[i] * (y[i] - m)


@overload(lane_sum, prefer_literal=True, inline="always", jit_options=JIT_OPTIONS)
def _lane_sum_impl(kind, x, y, m):
    code = _kind(kind)
    if not isinstance(x, types.Array) or x.dtype not in (types.float32, types.float64):
        raise errors.TypingError(f"lane_sum: x must be a float32 or float64 array, got {x}")
    t = x.dtype
    contiguous = x.layout == "C" and x.ndim == 1 and (code not in _READS_Y or (y.layout == "C" and y.ndim == 1))

    lanes, np_t = lane_count(t), as_dtype(t)
    if not contiguous:
        def same_order(kind, x, y, m):
            n = x.size
            blocks = n - n % (_ACCUMULATORS * lanes)
            body = n - n % lanes
            part = np.zeros((_ACCUMULATORS, lanes), dtype=np_t)
            for i in range(blocks):
                part[(i // lanes) % _ACCUMULATORS, i % lanes] += _scalar_term(kind, x, y, t(m), i)
            acc = (part[0] + part[1]) + (part[2] + part[3])
            for i in range(blocks, body):
                acc[i % lanes] += _scalar_term(kind, x, y, t(m), i)
            width = lanes
            while width > 1:
                width //= 2
                for k in range(width):
                    acc[k] += acc[k + width]
            s = acc[0]
            for i in range(body, n):
                s += _scalar_term(kind, x, y, t(m), i)
            return s
        return same_order

    def impl(kind, x, y, m):
        n = x.size
        body = n - n % lanes
        s = _vector_part(kind, x, y, t(m), body)
        for i in range(body, n):
            s += _scalar_term(kind, x, y, t(m), i)
        return s

    return impl


def lane_axpy(dst, w, src):
    """``dst[i] += w * src[i]`` over the contiguous 1-D rows ``dst`` and ``src`` (as long),
    in vector registers whatever the row's length; callable from jitted code only.

    LLVM's own vector loop steps four registers at a time after checking that the rows
    do not overlap, so a row of 16 or 32 values runs its scalar remainder loop; this
    one steps one register and assumes the rows are distinct arrays.  Each value is
    rounded as the scalar ``dst[i] + w * src[i]`` rounds it (a product, then a sum)."""


@intrinsic
def _axpy_vectors(typingctx, dst, w, src, body):
    """``lane_axpy`` over indices [0, body), ``body`` a multiple of the lane count."""
    dtype = dst.dtype

    def codegen(context, builder, signature, args):
        dst_value, w_value, src_value, count = args
        vector, align = vector_type(context, builder, dtype)
        lanes = vector.count
        dst_data = context.make_array(dst)(context, builder, dst_value).data
        src_data = context.make_array(src)(context, builder, src_value).data
        vw = splat(builder, vector, w_value)
        end = context.cast(builder, count, signature.args[3], types.int64)
        _, loop, after, index = open_loop(builder, end, "axpy")
        target = builder.bitcast(builder.gep(dst_data, [index]), vector.as_pointer())
        source = builder.bitcast(builder.gep(src_data, [index]), vector.as_pointer())
        total = builder.fadd(builder.load(target, align=align), builder.fmul(vw, builder.load(source, align=align)))
        builder.store(total, target, align=align)
        close_loop(builder, index, lanes, end, loop, after)
        return context.get_dummy_value()

    return types.none(dst, w, src, body), codegen


@overload(lane_axpy, inline="always", jit_options=JIT_OPTIONS)
def _lane_axpy_impl(dst, w, src):
    for name, row in (("dst", dst), ("src", src)):
        if not (isinstance(row, types.Array) and row.layout == "C" and row.ndim == 1 and row.dtype == dst.dtype
                and row.dtype in (types.float32, types.float64)):
            raise errors.TypingError(f"lane_axpy: {name} must be a contiguous 1-D float32 or float64 row of "
                                     f"dst's dtype, got {row}")
    t, lanes = dst.dtype, lane_count(dst.dtype)

    def impl(dst, w, src):
        n = dst.size
        body = n - n % lanes
        _axpy_vectors(dst, t(w), src, body)
        for i in range(body, n):
            dst[i] += t(w) * src[i]

    return impl
