"""Gradient clipping on the device: ``clip_grad_norm_`` and ``clip_grad_value_``.

When the parameters given are exactly those of an optimizer's flat buffer (the usual
``clip_grad_norm_(model.parameters(), 1.0)`` after the first step), each (device,
dtype) costs one reduction over its flat gradient section and one in-place scale;
other gradients are handled one tensor at a time.  Nothing is read back to the host
(unless ``error_if_nonfinite``), so clipping can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from tensorcore import Tensor, versions
from tensorcore.backends import backend_for

from .packing import packing_of


def _grad_arrays(parameters: Iterable[Tensor] | Tensor) -> list[tuple[Any, Any]]:
    """(backend, flat gradient array) pieces that together hold every gradient once:
    a whole flat grad section when every gradient in it was given, else one tensor."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    given = {id(p): p for p in params if p.grad is not None}
    packings = {}
    for p in given.values():
        packing = packing_of(p)
        if packing is not None:
            packings[id(packing)] = packing
    pieces, covered = [], set()
    for packing in packings.values():
        for buffer in packing.buffers.values():
            segments = [s for s in packing.segments if s.buffer is buffer]
            with_grad = [q for s in segments for q in s.params if q.grad is not None]
            if with_grad and all(id(q) in given for q in with_grad):
                for segment in segments:
                    if not segment.grads_are_views():
                        segment.gather_grads()
                pieces.append((buffer.backend, buffer.sections["grad"]))
                covered.update(id(q) for q in with_grad)
    for key, p in given.items():
        if key not in covered:
            backend = backend_for(p.grad.device)
            pieces.append((backend, backend.reshape(p.grad.data, (-1,))))
    return pieces


def _norm_part(backend: Any, g: Any, norm_type: float) -> Any:
    """A 1-element array: max |g| (inf norm), or sum |g|^p."""
    if math.isinf(norm_type):
        return backend.reshape(backend.reduce("max", backend.unary("abs", g), None, False), (1,))
    if norm_type == 2.0:
        return backend.reshape(backend.array(backend.matmul(g, g)), (1,))
    powered = backend.binary("pow", backend.unary("abs", g), backend.full((1,), norm_type, g.dtype))
    return backend.reshape(backend.reduce("sum", powered, None, False), (1,))


def clip_grad_norm_(parameters: Iterable[Tensor] | Tensor, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
    """Scale all gradients together so their total ``norm_type`` norm is at most
    ``max_norm`` (as ``torch.nn.utils.clip_grad_norm_``); returns the norm before
    clipping as a 0-d Tensor on the gradients' device."""
    norm_type = float(norm_type)
    if math.isnan(max_norm) or max_norm < 0:
        raise ValueError(f"clip_grad_norm_: max_norm must be >= 0, got {max_norm}")
    if math.isnan(norm_type) or norm_type <= 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be > 0 or inf, got {norm_type}")
    pieces = _grad_arrays(parameters)
    if not pieces:
        return Tensor(backend_for("cpu").full((), 0.0, "float32"), "cpu")
    devices = {b.device for b, _ in pieces}
    if len(devices) > 1:
        raise ValueError(f"clip_grad_norm_: gradients live on several devices {sorted(devices)}")
    backend = pieces[0][0]
    dtype = max((g.dtype for _, g in pieces), key=lambda d: d.itemsize)
    parts = backend.concatenate([backend.astype(_norm_part(b, g, norm_type), dtype) for b, g in pieces], 0)
    if math.isinf(norm_type):
        total = backend.reduce("max", parts, None, False)
    else:
        total = backend.binary("pow", backend.reduce("sum", parts, None, False),
                               backend.full((), 1.0 / norm_type, dtype))
    if error_if_nonfinite and not math.isfinite(float(backend.to_numpy(total))):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} is non-finite; "
                           "set error_if_nonfinite=False to clip anyway")
    coef = backend.binary("minimum", backend.binary("div", backend.full((), max_norm, dtype),
                                                    backend.binary("add", total, backend.full((), 1e-6, dtype))),
                          backend.full((), 1.0, dtype))
    for b, g in pieces:
        b.copy_(g, b.binary("mul", g, b.astype(coef, g.dtype)))
        versions.bump(g)
    return Tensor(total, devices.pop())


def clip_grad_value_(parameters: Iterable[Tensor] | Tensor, clip_value: float) -> None:
    """Clamp every gradient element to [-clip_value, clip_value] in place."""
    if math.isnan(clip_value) or clip_value < 0:
        raise ValueError(f"clip_grad_value_: clip_value must be >= 0, got {clip_value}")
    for backend, g in _grad_arrays(parameters):
        backend.clip(g, -clip_value, clip_value, out=g)
        versions.bump(g)
