"""NumPy's own matrix product, callable from jitted code.

A native plan (``native_plan.py``) runs its matrix products inside one jitted function.
For the results to be NumPy's bit for bit, it calls the very ``cblas_?gemm`` of the
OpenBLAS that ``np.matmul`` calls, with the arguments ``np.matmul`` passes for a 2-D
matrix-matrix product (``gemm_arguments`` follows NumPy's ``matmul`` loop: row-major,
each operand transposed or not by its strides).  Products NumPy computes some other way
(a vector operand, ``a @ a.T`` through ``syrk``, operands it copies first) get no
native form, and stay NumPy calls.

The library's address is found at run time and passed to jitted code as an argument,
so the compiled code can be cached on disk.  Only NumPy's bundled 64-bit-index
OpenBLAS (``scipy_openblas64_``, NumPy's wheels) is recognised; with any other BLAS
there is no native matrix product.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
_SYMBOLS = {"float32": "scipy_cblas_sgemm64_", "float64": "scipy_cblas_dgemm64_"}


@functools.lru_cache(maxsize=None)
def gemm_address(dtype: str) -> int | None:
    """The address of ``cblas_?gemm`` (``dtype`` "float32" or "float64") in the BLAS that
    NumPy's ``matmul`` calls, or None when that is not NumPy's bundled OpenBLAS."""
    symbol = _SYMBOLS.get(dtype)
    if symbol is None:
        return None
    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    try:
        from threadpoolctl import ThreadpoolController

        controllers = ThreadpoolController().select(user_api="blas").lib_controllers
    except ImportError:
        return None
    for controller in controllers:
        if os.path.dirname(controller.filepath) == libs:
            function = getattr(controller.dynlib, symbol, None)
            return None if function is None else ctypes.cast(function, ctypes.c_void_p).value
    return None


def _blasable(stride_slow: int, stride_fast: int, slow: int, fast: int, itemsize: int) -> bool:
    """NumPy's ``is_blasable2d``: the fast axis is contiguous and the slow one steps over it."""
    return stride_fast == itemsize and stride_slow % itemsize == 0 and stride_slow // itemsize >= fast


def gemm_arguments(a: Any, b: Any, out: Any) -> tuple[int, int, int, int, int, int, int, int] | None:
    """(trans_a, trans_b, M, N, K, lda, ldb, ldc) of the ``cblas_?gemm`` call that
    ``np.matmul(a, b, out=out)`` makes, for 2-D float arrays of one dtype; None when
    NumPy would not make exactly one such call (see the module docstring)."""
    if not (a.ndim == b.ndim == out.ndim == 2 and a.dtype == b.dtype == out.dtype):
        return None
    if gemm_address(a.dtype.name) is None:
        return None
    m, n = a.shape
    p = b.shape[1]
    size = a.itemsize
    if min(m, n, p) <= 1 or out.shape != (m, p) or not _blasable(*out.strides, m, p, size):
        return None
    (a_m, a_n), (b_n, b_p) = a.strides, b.strides
    op_a, op_b = _operand(a_m, a_n, m, n, size), _operand(b_n, b_p, n, p, size)
    if op_a is None or op_b is None:
        return None
    (trans_a, lda), (trans_b, ldb) = op_a, op_b
    same_memory = a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    if same_memory and m == p and a_m == b_p and a_n == b_n and trans_a != trans_b:
        return None  # NumPy takes syrk for a @ a.T
    return trans_a, trans_b, m, p, n, lda, ldb, out.strides[0] // size


def _operand(row: int, col: int, rows: int, cols: int, size: int) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) of a [rows, cols] operand with byte strides
    (row, col) as BLAS reads it: stored as it is or transposed; None for neither."""
    if _blasable(row, col, rows, cols, size):
        return NO_TRANS, row // size
    if _blasable(col, row, cols, rows, size):
        return TRANS, col // size
    return None


@intrinsic
def _call_gemm(typingctx, address, trans_a, trans_b, m, n, k, one, a, lda, b, ldb, c, ldc):
    """cblas_?gemm(row-major, trans_a, trans_b, m, n, k, 1, a, lda, b, ldb, 0, c, ldc)
    through the function at ``address``; ``one`` (1 in the operands' float type) picks
    single or double precision, ``a``/``b``/``c`` are data addresses."""
    if not isinstance(one, types.Float):
        return None
    i64 = types.int64
    signature = types.void(i64, i64, i64, i64, i64, i64, one, types.uintp, i64, types.uintp, i64, types.uintp, i64)

    def codegen(context, builder, sig, args):
        address_, ta, tb, m_, n_, k_, one_, a_, lda_, b_, ldb_, c_, ldc_ = args
        i32, i64_, byte_ptr = ir.IntType(32), ir.IntType(64), ir.IntType(8).as_pointer()
        real = one_.type
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64_, i64_, i64_, real, byte_ptr, i64_, byte_ptr,
                                               i64_, real, byte_ptr, i64_])
        function = builder.inttoptr(address_, fnty.as_pointer())
        builder.call(function, [ir.Constant(i32, ROW_MAJOR), builder.trunc(ta, i32), builder.trunc(tb, i32),
                                m_, n_, k_, one_, builder.inttoptr(a_, byte_ptr), lda_,
                                builder.inttoptr(b_, byte_ptr), ldb_, ir.Constant(real, 0.0),
                                builder.inttoptr(c_, byte_ptr), ldc_])
        return context.get_dummy_value()

    return signature, codegen


@njit(cache=True)
def gemm(address, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc):  # pragma: no cover (compiled)
    """c = a @ b through NumPy's ``cblas_?gemm`` at ``address`` (``gemm_arguments``)."""
    _call_gemm(address, trans_a, trans_b, m, n, k, c.dtype.type(1.0), a.ctypes.data, lda, b.ctypes.data, ldb,
               c.ctypes.data, ldc)
