"""Tensor creation: from data, constants, ranges, and ``*_like`` forms."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import dlpack, dtypes, versions
from .backends import backend_for, default_device_name
from .devices import canonical
from .ops.shape_utils import nested_shape
from .sizes import check_size
from .tensor import Tensor


def _device(device: Any) -> str:
    return canonical(device) if device is not None else default_device_name()


def _shape(op: str, shape: tuple, dtype: Any, device: str) -> tuple[int, ...]:
    """The requested shape (one tuple/list or the ints themselves), checked against the device's memory."""
    if len(shape) == 1 and isinstance(shape[0], tuple | list):
        shape = tuple(shape[0])
    return check_size(op, shape, dtype, device)


def tensor(data: Any, dtype: Any = None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    """A new tensor copied from data (nested lists, scalars, arrays, tensors).

    Python floats become float32 and Python ints int64, as in PyTorch; arrays keep
    their dtype unless ``dtype`` is given.
    """
    device = _device(device)
    if isinstance(data, Tensor):
        data = data.numpy()
    elif hasattr(data, "__cuda_array_interface__"):  # a CuPy array: copy it to the host first
        data = data.get()
    elif isinstance(data, list | tuple):
        nested_shape(data, "tensor: the data")
    elif not isinstance(data, bool | int | float | np.generic) and not hasattr(data, "__array__"):
        raise TypeError(f"tensor: expected a number, a nested list of numbers, an array or a Tensor, "
                        f"got {type(data).__name__}")
    keeps_dtype = hasattr(data, "dtype")
    array = np.array(data, dtype=None if dtype is None else dtypes.as_dtype(dtype))
    if dtype is None and not keeps_dtype and array.dtype == np.float64:
        array = array.astype(dtypes.default_float)
    if not dtypes.is_supported(array.dtype):
        raise TypeError(f"tensor: expected numbers of a supported dtype ({', '.join(dtypes.SUPPORTED)}), "
                        f"got data of dtype {array.dtype}")
    return Tensor(backend_for(device).from_numpy(array), device, requires_grad)


def as_tensor(data: Any, dtype: Any = None, device: str | None = None) -> Tensor:
    """Like ``tensor`` but a Tensor of the right dtype and device is returned as is."""
    if isinstance(data, Tensor) and (dtype is None or data.dtype == dtypes.as_dtype(dtype)) and (device is None or data.device == device):
        return data
    return tensor(data, dtype, device)


def from_numpy(array: np.ndarray) -> Tensor:
    """A CPU tensor sharing memory with ``array``."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}")
    if not dtypes.is_supported(array.dtype):
        raise TypeError(f"from_numpy: dtype {array.dtype} is not supported")
    return Tensor(array, "cpu")


def _filled(op: str, shape: tuple, value: Any, dtype: Any, device: str | None, requires_grad: bool) -> Tensor:
    device, dtype = _device(device), dtypes.as_dtype(dtype)
    data = backend_for(device).full(_shape(op, shape, dtype, device), value, dtype)
    return Tensor(data, device, requires_grad)


def zeros(*shape: Any, dtype: Any = dtypes.float32, device: str | None = None, requires_grad: bool = False) -> Tensor:
    return _filled("zeros", shape, 0, dtype, device, requires_grad)


def ones(*shape: Any, dtype: Any = dtypes.float32, device: str | None = None, requires_grad: bool = False) -> Tensor:
    return _filled("ones", shape, 1, dtype, device, requires_grad)


def full(shape: Any, fill_value: Any, dtype: Any = None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    if dtype is None:
        dtype = dtypes.bool_ if isinstance(fill_value, bool) else dtypes.int64 if isinstance(fill_value, int) else dtypes.float32
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return _filled("full", shape, fill_value, dtype, device, requires_grad)


def empty(*shape: Any, dtype: Any = dtypes.float32, device: str | None = None, requires_grad: bool = False) -> Tensor:
    device, dtype = _device(device), dtypes.as_dtype(dtype)
    return Tensor(backend_for(device).empty(_shape("empty", shape, dtype, device), dtype), device, requires_grad)


def zeros_like(t: Tensor, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return zeros(*t.shape, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


def ones_like(t: Tensor, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return ones(*t.shape, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


def full_like(t: Tensor, fill_value: Any, dtype: Any = None) -> Tensor:
    return full(t.shape, fill_value, dtype=dtype or t.dtype, device=t.device)


def empty_like(t: Tensor, dtype: Any = None) -> Tensor:
    return empty(*t.shape, dtype=dtype or t.dtype, device=t.device)


def arange(start: float, end: float | None = None, step: float = 1, dtype: Any = None, device: str | None = None) -> Tensor:
    """Values from start (inclusive) to end (exclusive); int64 for int arguments."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange: step must not be zero")
    if not all(math.isfinite(v) for v in (start, end, step)):
        raise ValueError(f"arange: start, end and step must be finite, got {start}, {end}, {step}")
    if dtype is None:
        dtype = dtypes.int64 if all(isinstance(v, int) for v in (start, end, step)) else dtypes.float32
    device, dtype = _device(device), dtypes.as_dtype(dtype)
    check_size("arange", (max(0, math.ceil((end - start) / step)),), dtype, device)
    return Tensor(backend_for(device).arange(start, end, step, dtype), device)


def linspace(start: float, end: float, steps: int, dtype: Any = dtypes.float32, device: str | None = None) -> Tensor:
    device, dtype = _device(device), dtypes.as_dtype(dtype)
    (steps,) = check_size("linspace", (steps,), dtype, device)
    return Tensor(backend_for(device).linspace(start, end, steps, dtype), device)


def eye(n: int, m: int | None = None, dtype: Any = dtypes.float32, device: str | None = None) -> Tensor:
    device, dtype = _device(device), dtypes.as_dtype(dtype)
    n, m = check_size("eye", (n, n if m is None else m), dtype, device)
    return Tensor(backend_for(device).eye(n, m, dtype), device)


def from_dlpack(obj: Any) -> Tensor:
    """Zero-copy import of a DLPack-capable array (torch, cupy, jax, numpy)."""
    device_type, _ = obj.__dlpack_device__()
    if device_type == 1:  # kDLCPU
        return _from_dlpack_array(dlpack.import_cpu(obj), "cpu")  # bfloat16 too, which NumPy cannot import
    if device_type == 2:  # kDLCUDA
        return _from_dlpack_array(backend_for("cuda").from_dlpack(obj), "cuda")
    raise ValueError(f"from_dlpack: unsupported DLPack device type {device_type}")


def _from_dlpack_array(array: Any, device: str) -> Tensor:
    if not dtypes.is_supported(array.dtype):
        raise TypeError(f"from_dlpack: dtype {array.dtype} is not supported; convert the tensor to one of "
                        f"{', '.join(dtypes.SUPPORTED)} before exporting it")
    versions.mark_shared(array)  # the producer may still write it where no version counts
    return Tensor(array, device)
