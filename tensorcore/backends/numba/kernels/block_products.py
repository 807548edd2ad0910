"""Batches of small matrix products on every core: ``out[k] = a[k] @ b[k]``.

Winograd convolutions multiply 36 small matrices per call ([64, 64] @ [64, 64] and the
like).  BLAS runs each such product on one thread (too small to split), one after the
other, so a batch of them used one core at about 90 GFLOP/s.  Here each parallel task
takes one product of the batch, and the product is built from register blocks.

A register block (``_register_block``, LLVM IR) computes ``rows`` rows by ``vectors``
vector registers of columns (16 float32 or 8 float64 values each) of the product, its
``rows * vectors`` sums held in registers for the whole contraction: at each step of
the contraction it loads ``vectors`` registers of a row of ``b``, broadcasts ``rows``
values of a column of ``a`` and issues ``rows * vectors`` fused multiply-adds
(``fma``: one rounding each).  Eight rows by two registers is sixteen independent
sums, twice the eight that two FMA units with a four-cycle latency need to stay
busy, and ten loads per sixteen FMAs (19 of the 32 registers); eight rows measured
faster than four or six on the weight gradient's products and no slower elsewhere
(docs/benchmarks.md#cpu-convolution-algorithms).  Each output value is summed in the
contraction's order, one FMA per term, so the result does not depend on the
blocking or the threads.

``a`` may have any strides (the weight gradient multiplies a transposed view); the rows
of ``b`` and ``out`` must be contiguous, and ``out``'s width a multiple of a register
block's (32 float32 or 16 float64 values; ``batched_matmul`` uses NumPy's ``matmul``
otherwise).  Blocks of one row finish the rows past the last whole block.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils, errors
from numba.extending import intrinsic

from .jit import helper, kernel
from .lanes import REGISTER_BYTES, close_loop, open_loop, splat, vector_type
from .parallel import parallel_for

BLOCK_ROWS = 8  # rows of a register block
BLOCK_VECTORS = 2  # vector registers of columns of a register block
BLOCK_BYTES = BLOCK_VECTORS * REGISTER_BYTES  # a block row's width: 32 float32, 16 float64
LARGEST_PRODUCT = 1 << 21  # multiply-adds of one product (M*K*N) up to which the batch runs
#                            here: BLAS splits larger ones across the threads itself


def batched_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``np.matmul(a, b, out=out)`` for [B, M, K] @ [B, K, N] products: on
    ``batched_products_`` when it can take them (float32 or float64 alike, N a whole
    number of register blocks' widths, the rows of b and out contiguous, each product
    at most LARGEST_PRODUCT multiply-adds), else NumPy's.  ``out`` must not overlap
    ``a`` or ``b``."""
    if out is None:
        out = np.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=np.result_type(a, b))
    if not (a.ndim == b.ndim == out.ndim == 3 and a.dtype == b.dtype == out.dtype
            and out.dtype in (np.float32, np.float64) and b.shape[2] % (BLOCK_BYTES // out.itemsize) == 0
            and a.shape[0] == b.shape[0] and a.shape[2] == b.shape[1]
            and a.shape[1] * a.shape[2] * b.shape[2] <= LARGEST_PRODUCT
            and out.shape == (a.shape[0], a.shape[1], b.shape[2])
            and b.strides[2] == b.itemsize and out.strides[2] == out.itemsize):
        return np.matmul(a, b, out=out)
    places = [_memory(x) for x in (out, a, b)]
    if any(p is None for p in places):
        return np.matmul(a, b, out=out)
    (out_memory, out_at), (a_memory, a_at), (b_memory, b_at) = places
    size = out.itemsize
    geometry = np.array((a.shape[0], a.shape[1], a.shape[2], b.shape[2],
                         out_at, out.strides[0] // size, out.strides[1] // size,
                         a_at, a.strides[0] // size, a.strides[1] // size, a.strides[2] // size,
                         b_at, b.strides[0] // size, b.strides[1] // size), dtype=np.int64)
    batched_products_(out_memory, a_memory, b_memory, geometry)
    return out


def _memory(x: np.ndarray) -> tuple[np.ndarray, int] | None:
    """The allocation ``x`` views, as a flat array, and the index of x's first element
    in it; None when that allocation is not one contiguous array of x's dtype or
    ``x``'s strides are not whole elements.  The kernel takes every operand so,
    whatever its strides: one compiled version per dtype, not one per layout."""
    root = x
    while isinstance(root.base, np.ndarray):
        root = root.base
    if (root.dtype != x.dtype or not root.flags.c_contiguous
            or any(stride % x.itemsize for stride in x.strides)):
        return None
    start = x.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return root.reshape(-1), start // x.itemsize


@intrinsic
def _register_block(typingctx, rows, out, out_at, out_row, a, a_at, a_row, a_step, b, b_at, b_row, depth):
    """out[r, v] = sum over s < depth of a[a_at + r*a_row + s*a_step] * b[b_at + s*b_row + v]
    for r < rows and v < BLOCK_VECTORS * lanes, ``out`` stored at ``out_at + r*out_row + v``
    (flat element offsets into each array's memory)."""
    if not isinstance(rows, types.IntegerLiteral) or rows.literal_value not in (1, BLOCK_ROWS):
        raise errors.TypingError(f"_register_block: rows must be a compile-time 1 or {BLOCK_ROWS}, got {rows}")
    block_rows, block_vectors = rows.literal_value, BLOCK_VECTORS
    dtype = out.dtype
    if a.dtype != dtype or b.dtype != dtype or dtype not in (types.float32, types.float64):
        raise errors.TypingError(f"_register_block: out, a and b must share float32 or float64, got "
                                 f"{out.dtype}, {a.dtype}, {b.dtype}")

    def codegen(context, builder, signature, args):
        (_, out_v, out_at_v, out_row_v, a_v, a_at_v, a_row_v, a_step_v,
         b_v, b_at_v, b_row_v, depth_v) = args
        i64 = ir.IntType(64)
        cast = [context.cast(builder, value, signature.args[k], types.int64)
                for k, value in ((2, out_at_v), (3, out_row_v), (5, a_at_v), (6, a_row_v),
                                 (7, a_step_v), (9, b_at_v), (10, b_row_v), (11, depth_v))]
        out_at_v, out_row_v, a_at_v, a_row_v, a_step_v, b_at_v, b_row_v, end = cast
        vector, align = vector_type(context, builder, dtype)
        lanes = vector.count
        out_data = context.make_array(out)(context, builder, out_v).data
        a_data = context.make_array(a)(context, builder, a_v).data
        b_data = context.make_array(b)(context, builder, b_v).data
        zero = ir.Constant(vector, [0.0] * lanes)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector] * 3),
                                             f"llvm.fma.v{lanes}f{dtype.bitwidth}")

        before, loop, after, step = open_loop(builder, end, "block")
        sums = []
        for _ in range(block_rows * block_vectors):
            phi = builder.phi(vector)
            phi.add_incoming(zero, before)
            sums.append(phi)
        b_start = builder.add(b_at_v, builder.mul(step, b_row_v))
        b_regs = [builder.load(builder.bitcast(builder.gep(b_data, [builder.add(b_start, i64(v * lanes))]),
                                               vector.as_pointer()), align=align)
                  for v in range(block_vectors)]
        a_start = builder.add(a_at_v, builder.mul(step, a_step_v))
        updated = []
        for r in range(block_rows):
            value = builder.load(builder.gep(a_data, [builder.add(a_start, builder.mul(i64(r), a_row_v))]))
            broadcast = splat(builder, vector, value)
            for v in range(block_vectors):
                updated.append(builder.call(fma, [broadcast, b_regs[v], sums[r * block_vectors + v]]))
        for phi, value in zip(sums, updated):
            phi.add_incoming(value, loop)
        close_loop(builder, step, 1, end, loop, after)
        results = []
        for value in updated:
            result = builder.phi(vector)
            result.add_incoming(zero, before)
            result.add_incoming(value, loop)
            results.append(result)
        for r in range(block_rows):
            row_start = builder.add(out_at_v, builder.mul(i64(r), out_row_v))
            for v in range(block_vectors):
                target = builder.gep(out_data, [builder.add(row_start, i64(v * lanes))])
                builder.store(results[r * block_vectors + v], builder.bitcast(target, vector.as_pointer()),
                              align=align)
        return context.get_dummy_value()

    sig = types.none(rows, out, out_at, out_row, a, a_at, a_row, a_step, b, b_at, b_row, depth)
    return sig, codegen


@helper
def _column_block(out, a, b, g, k, col):
    """Columns [col, col + BLOCK_VECTORS registers) of out[k] = a[k] @ b[k], all rows
    (``g``: the geometry ``batched_matmul`` packs)."""
    m, depth, out_k, out_row, a_k, a_row, a_step, b_k, b_row = g[1], g[2], g[5], g[6], g[8], g[9], g[10], g[12], g[13]
    out_at, a_at, b_at = g[4] + k * out_k + col, g[7] + k * a_k, g[11] + k * b_k + col
    row = 0
    while row + BLOCK_ROWS <= m:
        _register_block(BLOCK_ROWS, out, out_at + row * out_row, out_row,
                        a, a_at + row * a_row, a_row, a_step, b, b_at, b_row, depth)
        row += BLOCK_ROWS
    while row < m:
        _register_block(1, out, out_at + row * out_row, out_row,
                        a, a_at + row * a_row, a_row, a_step, b, b_at, b_row, depth)
        row += 1


@helper
def _one_product(k, out, a, b, g):
    """out[k] = a[k] @ b[k], one register block's columns after another."""
    for col in range(0, g[3], BLOCK_BYTES // out.itemsize):
        _column_block(out, a, b, g, k, col)


@kernel
def batched_products_(out, a, b, geometry):
    """out[k] = a[k] @ b[k], each operand given as the flat memory it lies in, its
    first element's index and its strides in elements (``geometry``, as
    ``batched_matmul`` packs it: B, M, K, N, then out's, a's and b's start and
    strides); one task per k."""
    parallel_for(_one_product, geometry[0], (out, a, b, geometry))
