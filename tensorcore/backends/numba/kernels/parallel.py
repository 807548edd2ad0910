"""``parallel_for(body, count, args)``: the kernels' one parallel loop.

Inside a kernel, ``parallel_for(_row, rows, (x, out))`` calls ``_row(i, x, out)`` for
every ``i`` in ``range(rows)``, split into contiguous chunks, one per thread of
Numba's pool (as many as ``numba.get_num_threads()`` gives the calling thread, which
``threads.SizedKernel`` sets; one thread runs the loop in place, with no parallel
region).  ``body`` is a jitted function (``helper``) taking the index first and the
tuple's items after it; it returns nothing, and each index writes its own part of the
outputs.  The body is inlined into the chunk loop and gets the arrays borrowed (no
reference counting: the kernel holds them), as ``prange`` bodies do, so a body per
short row costs no more than the row's loop.  A body doing one element per index
starts with ``i = np.uintp(i)``: with a signed index every ``a[i]`` keeps Numba's
wraparound of negative indices, which stops the chunk loop from vectorising.

Why not ``prange``: Numba's parallel transform compiles every ``prange`` loop as two
more functions (the loop body as a "gufunc" and its wrapper), each through the whole
pipeline and LLVM, in modules of their own; on a cold cache that was three fifths of
a training run's compile time.  Here the body is an ordinary jitted function and the
chunk loop is a few lines of LLVM IR emitted into the kernel's own module, then
handed to the threading layer's ``numba_parallel_for``, the entry point the parallel
transform itself calls.  The thread pool, its thread counts and its threading layers
are Numba's, unchanged.
"""

from __future__ import annotations

import itertools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

MAX_CHUNKS = 256  # chunks one call splits into (the schedule lives on the stack)

_I32, _I64 = ir.IntType(32), ir.IntType(64)
_BYTE_PTR = ir.IntType(8).as_pointer()
# numba_parallel_for(fn, args, dims, steps, data, inner_ndim, array_count, num_threads) calls
# fn(args', dims', steps, data) once per r in range(dims[0]), args'[j] = args[j] + r * steps[j]
_PARALLEL_FOR = ir.FunctionType(ir.VoidType(), [_BYTE_PTR, _BYTE_PTR.as_pointer(), _I64.as_pointer(),
                                                _I64.as_pointer(), _BYTE_PTR, _I64, _I64, _I32])
_CHUNK = ir.FunctionType(ir.VoidType(), [_BYTE_PTR.as_pointer(), _I64.as_pointer(), _I64.as_pointer(), _BYTE_PTR])
_ROW_BYTES = 16  # one schedule row: [start, stop) as two int64
_chunk_names = itertools.count()


def _start_pool() -> None:
    """Load the threading layer (its symbols resolve a compiled kernel's calls); Numba
    runs this again before it loads a kernel from the disk cache."""
    from numba.np.ufunc.parallel import _launch_threads

    _launch_threads()


@intrinsic(prefer_literal=True)
def parallel_for(typingctx, body, count, args):
    """Call ``body(i, *args)`` for ``i`` in ``range(count)`` on the calling thread's
    Numba threads (see the module docstring).

    Typed with the arguments' literal types first (an activation code stays a
    compile-time constant for the body): typed without them first, a body needing a
    constant would fail to compile, and Numba keeps that failure, with the traceback of
    the calling frames and every array they hold, for the process's lifetime."""
    if not isinstance(body, types.Dispatcher):
        raise TypeError(f"parallel_for: body must be a jitted function, got {body}")
    if not isinstance(count, types.Integer) or not isinstance(args, types.BaseTuple):
        raise TypeError(f"parallel_for: expected (body, int count, tuple args), got ({body}, {count}, {args})")
    body_sig = typingctx.resolve_function_type(body, (types.intp, *args.types), {})
    if body_sig is None:
        raise TypeError(f"parallel_for: {body.dispatcher.py_func.__name__} cannot take (intp, {args})")

    def codegen(context, builder, signature, llargs):
        _start_pool()
        compiled = body.dispatcher.overloads[body_sig.args]
        context.add_linking_libs([compiled.library])
        context.active_code_library._reload_init.add(_start_pool)
        count_value = context.cast(builder, llargs[1], count, types.intp)
        shared = ir.LiteralStructType([_I32, llargs[2].type])  # (a task failed, the arguments)
        chunk_fn = _emit_chunk(context, builder.module, compiled, shared, len(args))
        data = cgutils.alloca_once_value(builder, shared([ir.Constant(_I32, 0), ir.Undefined]))
        arguments = builder.gep(data, [ir.Constant(_I32, 0), ir.Constant(_I32, 1)])
        builder.store(_borrowed(builder, llargs[2], args), arguments)
        _emit_launch(builder, chunk_fn, count_value, builder.bitcast(data, _BYTE_PTR))
        failed = builder.load(builder.gep(data, [ir.Constant(_I32, 0), ir.Constant(_I32, 0)]))
        with builder.if_then(builder.icmp_unsigned("!=", failed, ir.Constant(_I32, 0)), likely=False):
            name = body.dispatcher.py_func.__qualname__
            context.call_conv.return_user_exc(builder, RuntimeError, (
                f"parallel_for: {name} raised in a parallel task (out of memory?); its message "
                "does not cross threads",))
        return context.get_dummy_value()

    return types.none(body, count, args), codegen


def _borrowed(builder, pack, args):
    """The argument tuple with its arrays' reference-count pointers (meminfo) null: the
    kernel holds the arrays for the whole loop, and a body's reference updates would
    otherwise be atomic operations on one counter from every thread."""
    for k, item_type in enumerate(args.types):
        if isinstance(item_type, types.Array):
            item = builder.extract_value(pack, k)
            item = builder.insert_value(item, cgutils.get_null_value(item.type.elements[0]), 0)
            pack = builder.insert_value(pack, item, k)
    return pack


def _emit_chunk(context, module, compiled, shared_type, arity):
    """The function each thread runs: read its [start, stop) row and the packed
    arguments, call the body for every index of the row; a failing call (an array
    the body allocates, out of memory) sets the shared flag."""
    fn = ir.Function(module, _CHUNK, name=f"tensorcore_parallel_chunk_{next(_chunk_names)}")
    fn.linkage = "internal"
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    row = builder.bitcast(builder.load(fn.args[0]), _I64.as_pointer())
    start = builder.load(row)
    stop = builder.load(builder.gep(row, [ir.Constant(_I32, 1)]))
    shared = builder.bitcast(fn.args[3], shared_type.as_pointer())
    pack = builder.load(builder.gep(shared, [ir.Constant(_I32, 0), ir.Constant(_I32, 1)]))
    values = [builder.extract_value(pack, k) for k in range(arity)]
    body = context.declare_function(module, compiled.fndesc)
    fndesc = compiled.fndesc
    with cgutils.for_range_slice(builder, start, stop, ir.Constant(_I64, 1), inc=True) as (index, _):
        status, _ = context.call_conv.call_function(builder, body, fndesc.restype, fndesc.argtypes,
                                                    [index, *values], attrs=("alwaysinline",))
        with builder.if_then(status.is_error, likely=False):
            flag = builder.gep(shared, [ir.Constant(_I32, 0), ir.Constant(_I32, 0)])
            builder.store_atomic(ir.Constant(_I32, 1), flag, "monotonic", 4)
    builder.ret_void()
    return fn


def _emit_launch(builder, chunk_fn, count, data):
    """Split [0, count) into min(threads, count, MAX_CHUNKS) even chunks and run them:
    in place on one chunk, else through ``numba_parallel_for``."""
    module = builder.module
    one, row_bytes = ir.Constant(_I64, 1), ir.Constant(_I64, _ROW_BYTES)
    # declared as Numba's own code declares it (returning intp); the C function returns an int
    get_threads = cgutils.get_or_insert_function(module, ir.FunctionType(_I64, []), "get_num_threads")
    chunks = builder.sext(builder.trunc(builder.call(get_threads, []), _I32), _I64)
    for limit in (count, ir.Constant(_I64, MAX_CHUNKS)):
        chunks = builder.select(builder.icmp_signed("<", limit, chunks), limit, chunks)
    chunks = builder.select(builder.icmp_signed("<", chunks, one), one, chunks)
    schedule = cgutils.alloca_once(builder, _I64, size=ir.Constant(_I64, 2 * MAX_CHUNKS))
    with cgutils.for_range(builder, chunks) as loop:
        r = loop.index
        row = builder.gep(schedule, [builder.mul(r, ir.Constant(_I64, 2))])
        builder.store(builder.sdiv(builder.mul(r, count), chunks), row)
        builder.store(builder.sdiv(builder.mul(builder.add(r, one), count), chunks), builder.gep(row, [one]))
    rows = cgutils.alloca_once_value(builder, builder.bitcast(schedule, _BYTE_PTR))
    steps = cgutils.alloca_once_value(builder, row_bytes)
    with builder.if_else(builder.icmp_signed("==", chunks, one)) as (in_place, threaded):
        with in_place:
            builder.call(chunk_fn, [rows, cgutils.alloca_once_value(builder, one), steps, data])
        with threaded:
            launch = cgutils.get_or_insert_function(module, _PARALLEL_FOR, "numba_parallel_for")
            builder.call(launch, [builder.bitcast(chunk_fn, _BYTE_PTR), rows,
                                  cgutils.alloca_once_value(builder, chunks), steps, data,
                                  ir.Constant(_I64, 0), one, builder.trunc(chunks, _I32)])
