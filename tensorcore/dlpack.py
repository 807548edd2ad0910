"""DLPack capsules for bfloat16, which NumPy cannot export or import itself.

DLPack has a bfloat16 type code (kDLBfloat) and PyTorch and JAX use it, but NumPy's
DLPack support stops at its own dtypes.  A bfloat16 array is exported as its raw
16-bit buffer (a uint16 view, which NumPy and CuPy export) with the capsule's type
code then set to kDLBfloat; a CPU capsule with that code is imported by relabelling
it uint16 for NumPy and viewing the result as bfloat16.  Both directions share the
buffer, as DLPack intends.

The capsule holds a ``DLManagedTensor`` (or ``DLManagedTensorVersioned`` when the
consumer asked for DLPack 1.x); only the ``code`` byte of its ``DLTensor.dtype`` is
touched, at the offsets the DLPack ABI fixes.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .dtypes import bfloat16_dtype

_KDL_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}
_KDL_UINT, _KDL_BFLOAT = 1, 4
_POINTER = ctypes.sizeof(ctypes.c_void_p)
# DLTensor: data pointer, DLDevice (two int32), int32 ndim, then DLDataType {uint8 code,
# uint8 bits, uint16 lanes}
_DTYPE_OFFSET = _POINTER + 8 + 4
# DLManagedTensorVersioned: DLPackVersion (two uint32), manager_ctx, deleter, uint64 flags,
# then the DLTensor
_VERSIONED_TENSOR_OFFSET = 8 + 2 * _POINTER + 8

_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype, _capsule_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


def _dtype_field(capsule: Any) -> _DataType:
    """The ``DLDataType`` inside an unconsumed DLPack capsule, writable in place."""
    name = _capsule_name(capsule)
    if name not in (b"dltensor", b"dltensor_versioned"):
        raise TypeError(f"from_dlpack: expected an unconsumed DLPack capsule, got one named {name!r}")
    tensor = _capsule_pointer(capsule, name) + (_VERSIONED_TENSOR_OFFSET if name == b"dltensor_versioned" else 0)
    return _DataType.from_address(tensor + _DTYPE_OFFSET)


def export_bfloat16(array: Any, **kwargs: Any) -> Any:
    """A DLPack capsule of a bfloat16 array (NumPy or CuPy) with the bfloat16 type code;
    ``kwargs`` are the consumer's ``__dlpack__`` arguments (``max_version``, ``stream``...)."""
    capsule = array.view(np.uint16).__dlpack__(**kwargs)
    _dtype_field(capsule).code = _KDL_BFLOAT
    return capsule


class _Relabelled:
    """A DLPack producer handing out one capsule, already taken from the real producer."""

    def __init__(self, capsule: Any, device: tuple[int, int]) -> None:
        self.capsule, self.device = capsule, device

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


def import_cpu(obj: Any) -> np.ndarray:
    """A NumPy array sharing the memory of a CPU DLPack producer; bfloat16 capsules
    (torch's, JAX's) come back as ml_dtypes bfloat16, unsupported dtypes raise a TypeError
    that names the dtype and what to do instead."""
    try:
        capsule = obj.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer from before DLPack 1.0 takes no arguments
        capsule = obj.__dlpack__()
    field = _dtype_field(capsule)
    code, bits, lanes = field.code, field.bits, field.lanes
    is_bfloat16 = (code, bits, lanes) == (_KDL_BFLOAT, 16, 1)
    if is_bfloat16:
        field.code = _KDL_UINT
    try:
        array = np.from_dlpack(_Relabelled(capsule, obj.__dlpack_device__()))
    except (BufferError, RuntimeError, TypeError) as exc:
        kind = f"{_KDL_CODES[code]}{bits}" if code in _KDL_CODES else f"{bits}-bit DLPack type code {code}"
        kind += f" with {lanes} lanes" if lanes != 1 else ""
        raise TypeError(f"from_dlpack: cannot import a DLPack tensor of dtype {kind} ({exc}); convert it to "
                        "a supported dtype (float16, bfloat16, float32, float64, int32, int64, bool, uint8) "
                        "before exporting it, e.g. x.float()") from exc
    return array.view(bfloat16_dtype()) if is_bfloat16 else array
