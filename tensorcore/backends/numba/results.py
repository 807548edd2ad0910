"""Results written into arrays the caller gives (``out=``), for the Numba kernels' methods.

A method taking ``out`` -- an array for a single result; for a tuple result a tuple of
arrays, None standing for an item the method allocates itself (a short tuple is padded
with None) -- writes each result into the array given for it and returns those arrays,
so a compiled plan's replay can hand its planned buffers over instead of copying each
result into them.  A given array must have its result's shape and dtype (else
ValueError, before anything is written); any strides are fine.

The kernels take their outputs as arguments: ``target`` is the array a kernel writes a
result into -- the given one where the kernel can (C-contiguous, or any strides for a
kernel that writes through strided views), a new one otherwise -- and ``deliver`` puts
a result in the given array (a copy, unless the kernel wrote it there).
"""

from __future__ import annotations

from typing import Any

import numpy as np

Array = Any


def items(op: str, out: Any, count: int) -> tuple:
    """``out`` (None or a tuple of up to ``count`` arrays or Nones) as ``count`` items."""
    given = () if out is None else tuple(out)
    if len(given) > count:
        raise ValueError(f"{op}: out holds {len(given)} arrays for {count} results")
    return given + (None,) * (count - len(given))


def check(op: str, given: Array | None, shape: tuple, dtype: Any) -> None:
    """Raise a ValueError unless ``given`` is None or an array of ``shape`` and ``dtype``."""
    if given is None:
        return
    if not isinstance(given, np.ndarray) or tuple(given.shape) != tuple(shape) or given.dtype != dtype:
        got = f"{getattr(getattr(given, 'dtype', None), 'name', type(given).__name__)} {tuple(np.shape(given))}"
        raise ValueError(f"{op}: out must be a {np.dtype(dtype).name} array of shape {tuple(shape)}, got {got}")


def target(given: Array | None, shape: tuple, dtype: Any, strided: bool = False) -> Array:
    """The array a kernel writes a result of ``shape`` into: ``given`` (checked by
    ``check``) when it is C-contiguous, or has any strides for a ``strided`` kernel;
    else a new array."""
    if given is not None and (strided or given.flags.c_contiguous):
        return given
    return np.empty(shape, dtype)


def deliver(given: Array | None, result: Array) -> Array:
    """``result``, or the given array holding it (copied in unless it is that array)."""
    if given is None or given is result:
        return result
    given[...] = result
    return given


def deliver_all(op: str, out: Any, results: tuple) -> tuple:
    """``results`` (a method's tuple result, None items allowed) delivered into the
    items of ``out``; every given array is checked before any is written."""
    given = items(op, out, len(results))
    for g, r in zip(given, results):
        if r is not None:
            check(op, g, r.shape, r.dtype)
    return tuple(r if r is None else deliver(g, r) for g, r in zip(given, results))
