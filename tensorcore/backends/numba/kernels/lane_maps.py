"""Rows of channel values moved and combined in vector registers: ``lane_map`` applies
a small fixed map at every index of a few rows, ``lane_transpose`` transposes a matrix.

``lane_map(transform, dst, dst_at, dst_step, src, src_at, src_step, n)`` computes, for
every ``i`` in ``range(n)``,

    (dst[dst_at + i], dst[dst_at + dst_step + i], ...) =
        transform(t, src[src_at + i], src[src_at + src_step + i], ...)

where ``transform`` is a jitted function of the dtype ``t`` and K values returning a
tuple of J values, built from ``+``, ``-``, ``*`` and constants ``t(c)`` (Winograd's
tile transforms), and the offsets index the arrays' memory in elements.  Winograd's
batch kernels transform six rows of channel values into six (or four) this way, at
every tile.

LLVM vectorises a loop with several rows in and out only after checking at run time
that none of them overlap, and then steps four registers at a time, so a row of 32
or 64 channels ran its scalar remainder loop.  Here the loop is written as LLVM IR:
``transform``'s Python source is run once on vectors of ``lanes`` values (one 512-bit
register: 16 float32 or 8 float64), each ``+``, ``-`` and ``*`` emitting the vector
instruction, then once on single values for the indices past the last whole
register.  Each value is rounded exactly as the scalar ``transform`` rounds it (the
same operations in the same order, no fused multiply-adds).

``lane_transpose(dst, dst_at, dst_row, src, src_at, src_row, rows, cols, wrap, gap)``
writes ``dst[dst_at + j*dst_row + (j // wrap)*gap + i] = src[src_at + i*src_row + j]``
for ``i < rows`` and ``j < cols``: Winograd's batch kernels turn an image [C, H*W] into
[H, W, C] with it, into a plane with ``gap`` values of padding after each image row.
A scalar loop does one load and one store per value; here each ``lanes`` x ``lanes``
block is loaded as ``lanes`` vectors, transposed in registers by log2(lanes) rounds of
two-vector shuffles (each round swaps the off-diagonal sub-blocks of one size) and
stored as ``lanes`` vectors.  Values outside whole blocks are copied one by one.
"""

from __future__ import annotations

import inspect

from llvmlite import ir
from numba import types
from numba.core import errors
from numba.extending import intrinsic, overload

from .jit import JIT_OPTIONS
from .lanes import close_loop, lane_count, open_loop, vector_type


def _check_rows(op: str, dst, src) -> None:
    """A TypingError unless ``dst`` and ``src`` are C-contiguous float arrays of one dtype."""
    for name, array in (("dst", dst), ("src", src)):
        if not (isinstance(array, types.Array) and array.layout == "C" and array.dtype == dst.dtype
                and array.dtype in (types.float32, types.float64)):
            raise errors.TypingError(f"{op}: {name} must be a C-contiguous float32 or float64 array of "
                                     f"dst's dtype, got {array}")


class _Values:
    """An LLVM value (a vector or a scalar) whose arithmetic emits instructions."""

    def __init__(self, builder, value) -> None:
        self.builder, self.value = builder, value

    def __add__(self, other: _Values) -> _Values:
        return _Values(self.builder, self.builder.fadd(self.value, other.value))

    def __sub__(self, other: _Values) -> _Values:
        return _Values(self.builder, self.builder.fsub(self.value, other.value))

    def __mul__(self, other: _Values) -> _Values:
        return _Values(self.builder, self.builder.fmul(self.value, other.value))


def _emit_loop(builder, transform, kind, align, rows, start, end, step):
    """``for i in range(start, end, step)``: the ``transform`` of the ``kind`` values (a
    vector or a scalar type) at ``src + i`` stored at ``dst + i``; ``rows`` is (the
    source row pointers, the destination row pointers)."""
    sources, targets = rows
    _, loop, after, index = open_loop(builder, end, "map", start)

    def constant(value: float) -> _Values:
        lanes = kind.count if isinstance(kind, ir.VectorType) else None
        return _Values(builder, ir.Constant(kind, [value] * lanes if lanes else value))

    inputs = [_Values(builder, builder.load(builder.bitcast(builder.gep(row, [index]), kind.as_pointer()),
                                            align=align)) for row in sources]
    for value, row in zip(transform(constant, *inputs), targets):
        builder.store(value.value, builder.bitcast(builder.gep(row, [index]), kind.as_pointer()), align=align)
    close_loop(builder, index, step, end, loop, after)


class _Count:
    """A stand-in value for counting a transform's outputs."""

    def __add__(self, other: _Count) -> _Count:
        return self

    __sub__ = __mul__ = __add__


@intrinsic
def lane_map(typingctx, transform, dst, dst_at, dst_step, src, src_at, src_step, n):
    """Apply ``transform`` at every index of the rows (see the module docstring);
    callable from jitted code only.  ``dst`` and ``src`` are C-contiguous float32 or
    float64 arrays of one dtype whose rows do not overlap."""
    if not isinstance(transform, types.Dispatcher):
        raise errors.TypingError(f"lane_map: the transform must be a jitted function, got {transform}")
    _check_rows("lane_map", dst, src)
    py_transform = transform.dispatcher.py_func
    inputs = len(inspect.signature(py_transform).parameters) - 1
    outputs = len(py_transform(lambda value: _Count(), *[_Count()] * inputs))
    dtype = dst.dtype

    def codegen(context, builder, signature, args):
        _, dst_v, dst_at_v, dst_step_v, src_v, src_at_v, src_step_v, n_v = args
        i64 = ir.IntType(64)
        dst_at_v, dst_step_v, src_at_v, src_step_v, end = (
            context.cast(builder, value, signature.args[k], types.int64)
            for k, value in ((2, dst_at_v), (3, dst_step_v), (5, src_at_v), (6, src_step_v), (7, n_v)))
        vector, align = vector_type(context, builder, dtype)
        dst_data = context.make_array(dst)(context, builder, dst_v).data
        src_data = context.make_array(src)(context, builder, src_v).data
        rows = ([builder.gep(src_data, [builder.add(src_at_v, builder.mul(i64(k), src_step_v))])
                 for k in range(inputs)],
                [builder.gep(dst_data, [builder.add(dst_at_v, builder.mul(i64(j), dst_step_v))])
                 for j in range(outputs)])
        body = builder.sub(end, builder.urem(end, i64(vector.count)))
        _emit_loop(builder, py_transform, vector, align, rows, None, body, vector.count)
        _emit_loop(builder, py_transform, vector.element, align, rows, body, end, 1)
        return context.get_dummy_value()

    return types.none(transform, dst, dst_at, dst_step, src, src_at, src_step, n), codegen


def _swap_rounds(builder, vectors: list) -> list:
    """The ``lanes`` vectors (the rows of a square block) transposed: for each sub-block
    size ``b`` (lanes/2, ..., 1), rows ``i`` and ``i + b`` (``i & b == 0``) swap the
    off-diagonal ``b`` x ``b`` sub-blocks between them."""
    lanes = len(vectors)
    mask_type = ir.VectorType(ir.IntType(32), lanes)
    size = lanes // 2
    while size:
        upper = ir.Constant(mask_type, [k if k & size == 0 else lanes + k - size for k in range(lanes)])
        lower = ir.Constant(mask_type, [k + size if k & size == 0 else lanes + k for k in range(lanes)])
        swapped = list(vectors)
        for i in range(lanes):
            if i & size == 0:
                swapped[i] = builder.shuffle_vector(vectors[i], vectors[i + size], upper)
                swapped[i + size] = builder.shuffle_vector(vectors[i], vectors[i + size], lower)
        vectors = swapped
        size //= 2
    return vectors


@intrinsic
def _transpose_block(typingctx, dst, dst_at, dst_row, wrap, gap, src, src_at, src_row):
    """One ``lanes`` x ``lanes`` block of ``lane_transpose``: src row ``i`` at ``src_at + i *
    src_row``, dst row ``k`` at ``dst_at + k * dst_row + (k // wrap) * gap``."""
    _check_rows("lane_transpose", dst, src)
    dtype = dst.dtype

    def codegen(context, builder, signature, args):
        dst_v, _, _, _, _, src_v, _, _ = args
        dst_at_v, dst_row_v, wrap_v, gap_v, src_at_v, src_row_v = (
            context.cast(builder, args[k], signature.args[k], types.int64) for k in (1, 2, 3, 4, 6, 7))
        i64 = ir.IntType(64)
        vector, align = vector_type(context, builder, dtype)
        dst_data = context.make_array(dst)(context, builder, dst_v).data
        src_data = context.make_array(src)(context, builder, src_v).data

        def row(data, at):
            return builder.bitcast(builder.gep(data, [at]), vector.as_pointer())

        lanes = vector.count
        loaded = [builder.load(row(src_data, builder.add(src_at_v, builder.mul(i64(k), src_row_v))), align=align)
                  for k in range(lanes)]
        for k, value in enumerate(_swap_rounds(builder, loaded)):
            wrapped = builder.mul(builder.udiv(i64(k), wrap_v), gap_v)
            at = builder.add(builder.add(dst_at_v, builder.mul(i64(k), dst_row_v)), wrapped)
            builder.store(value, row(dst_data, at), align=align)
        return context.get_dummy_value()

    return types.none(dst, dst_at, dst_row, wrap, gap, src, src_at, src_row), codegen


def lane_transpose(dst, dst_at, dst_row, src, src_at, src_row, rows, cols, wrap, gap):
    """``dst[dst_at + j*dst_row + (j // wrap)*gap + i] = src[src_at + i*src_row + j]`` for
    ``i < rows``, ``j < cols`` (see the module docstring): ``gap`` extra elements after
    every ``wrap`` rows of dst (an image's rows into a zero-padded plane; ``gap`` 0 for
    a plain transpose).  Callable from jitted code only.  ``dst`` and ``src`` are
    C-contiguous float32 or float64 arrays of one dtype, not overlapping; ``wrap`` >= 1.
    Columns run in blocks when ``gap`` is 0 or ``wrap`` divides the lane count or is a
    multiple of it, else one value at a time."""


@overload(lane_transpose, inline="always", jit_options=JIT_OPTIONS)
def _lane_transpose_impl(dst, dst_at, dst_row, src, src_at, src_row, rows, cols, wrap, gap):
    _check_rows("lane_transpose", dst, src)
    lanes = lane_count(dst.dtype)

    def impl(dst, dst_at, dst_row, src, src_at, src_row, rows, cols, wrap, gap):
        blocks = gap == 0 or lanes % wrap == 0 or wrap % lanes == 0
        whole_rows, whole_cols = rows - rows % lanes, (cols - cols % lanes) if blocks else 0
        for i in range(0, whole_rows, lanes):
            for j in range(0, whole_cols, lanes):
                _transpose_block(dst, dst_at + j * dst_row + (j // wrap) * gap + i, dst_row, wrap, gap,
                                 src, src_at + i * src_row + j, src_row)
        out, values = dst.reshape(-1), src.reshape(-1)
        for i in range(rows):
            for j in range(whole_cols if i < whole_rows else 0, cols):
                out[dst_at + j * dst_row + (j // wrap) * gap + i] = values[src_at + i * src_row + j]

    return impl
