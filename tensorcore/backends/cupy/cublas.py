"""Capture-safe GEMM: cuBLAS through our own handle, called with ctypes.

CuPy refuses its cuBLAS wrappers while a stream is being captured into a CUDA graph.
This module opens the same libcublas CuPy loaded, creates one handle per device, and
before every call binds the handle to the current stream and to a preallocated 32 MiB
workspace (the size the cuBLAS reference recommends for Hopper, eight times what it
asks for earlier GPUs; ``cublasSetStream`` resets the workspace, so both are set together).  With
the workspace given, cuBLAS allocates nothing during the call, so the call can be
captured and replayed.

All matrices are row-major here; ``gemm`` maps them onto column-major cuBLAS by
computing Cᵀ = Bᵀ Aᵀ.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any

import numpy

from .. import report

WORKSPACE_BYTES = 32 * 1024 * 1024

# cudaDataType / cublasComputeType_t / cublasOperation_t values from the cuBLAS headers.
_DATA_TYPE = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32, _COMPUTE_64F = 68, 77, 70
_OP_N, _OP_T = 0, 1
_GEMM_DEFAULT = -1


def _find_library() -> ctypes.CDLL:
    """The libcublas CuPy uses: the one already mapped into this process if any."""
    import cupy_backends.cuda.libs.cublas  # noqa: F401  (makes CuPy load libcublas)

    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "libcublas.so" in path and "libcublasLt" not in path:
                    return ctypes.CDLL(path)
    except OSError:
        pass
    for name in ("libcublas.so.13", "libcublas.so.12", ctypes.util.find_library("cublas")):
        if name:
            try:
                return ctypes.CDLL(name)
            except OSError:
                continue
    raise RuntimeError("cuBLAS: could not find the libcublas shared library CuPy uses")


class _Handle:
    """One cuBLAS handle with its workspace, bound to a stream per call."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        import cupy

        self.lib = lib
        self.handle = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        self.workspace = cupy.empty(WORKSPACE_BYTES, dtype=cupy.uint8)
        self.stream: int | None = None
        self.lock = threading.Lock()  # binding a stream and launching on it are one step

    def bind(self, stream_ptr: int) -> None:
        if stream_ptr == self.stream:
            return
        _check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream_ptr)),
               "cublasSetStream")
        _check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(self.workspace.data.ptr),
                                              ctypes.c_size_t(WORKSPACE_BYTES)),
               "cublasSetWorkspace")
        self.stream = stream_ptr


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLAS: {what} failed with status {status}")


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_handles: dict[int, _Handle] = {}


def handle() -> _Handle:
    """This device's handle (created on first use, outside any capture ideally)."""
    global _lib
    import cupy

    device = cupy.cuda.Device().id
    with _lock:
        if _lib is None:
            _lib = _find_library()
        if device not in _handles:
            _handles[device] = _Handle(_lib)
        return _handles[device]


def compute_type(dtype: Any, allow_tf32: bool) -> int:
    if numpy.dtype(dtype) == numpy.float64:
        return _COMPUTE_64F
    if numpy.dtype(dtype) == numpy.float32 and allow_tf32:
        return _COMPUTE_32F_FAST_TF32
    return _COMPUTE_32F


def supports(dtype: Any) -> bool:
    return numpy.dtype(dtype).name in _DATA_TYPE


def gemm(trans_a: bool, trans_b: bool, m: int, n: int, k: int, a_ptr: int, lda: int,
         stride_a: int, b_ptr: int, ldb: int, stride_b: int, c_ptr: int, ldc: int,
         stride_c: int, batch: int, dtype: Any, alpha: float = 1.0, beta: float = 0.0,
         allow_tf32: bool = False) -> None:
    """Row-major, strided-batched C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i].

    op(A) is [m, k] and op(B) is [k, n].  A row-major matrix is stored with leading
    dimension ``ld`` (elements between rows); ``trans_a`` says A is stored as its
    transpose ([k, m] with leading dimension lda).  Strides are in elements (0
    broadcasts one matrix over the batch).  Accumulates in float32 for 16-bit types.
    """
    import cupy

    h = handle()
    if report.active:
        report.note_kernel("cublasGemmEx" if batch == 1 else "cublasGemmStridedBatchedEx")
    dt = _DATA_TYPE[numpy.dtype(dtype).name]
    ct = compute_type(dtype, allow_tf32)
    scalar = ctypes.c_double if ct == _COMPUTE_64F else ctypes.c_float
    al, be = scalar(alpha), scalar(beta)
    # Column-major view: Cᵀ [n, m] = op(B)ᵀ [n, k] @ op(A)ᵀ [k, m].
    op_b = _OP_T if trans_b else _OP_N
    op_a = _OP_T if trans_a else _OP_N
    with h.lock:  # another thread must not re-bind the handle between bind and launch
        h.bind(cupy.cuda.get_current_stream().ptr)
        if batch == 1:
            status = h.lib.cublasGemmEx(
                h.handle, op_b, op_a, n, m, k, ctypes.byref(al),
                ctypes.c_void_p(b_ptr), dt, ldb, ctypes.c_void_p(a_ptr), dt, lda,
                ctypes.byref(be), ctypes.c_void_p(c_ptr), dt, ldc, ct, _GEMM_DEFAULT)
            _check(status, "cublasGemmEx")
            return
        status = h.lib.cublasGemmStridedBatchedEx(
            h.handle, op_b, op_a, n, m, k, ctypes.byref(al),
            ctypes.c_void_p(b_ptr), dt, ldb, ctypes.c_longlong(stride_b),
            ctypes.c_void_p(a_ptr), dt, lda, ctypes.c_longlong(stride_a),
            ctypes.byref(be), ctypes.c_void_p(c_ptr), dt, ldc, ctypes.c_longlong(stride_c),
            batch, ct, _GEMM_DEFAULT)
        _check(status, "cublasGemmStridedBatchedEx")
