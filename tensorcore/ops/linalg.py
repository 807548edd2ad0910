"""Matrix products (batched, broadcasting)."""

from __future__ import annotations

from typing import Any

from ..autograd import Function
from ..tensor import Tensor, as_tensor_like
from .shape_utils import broadcast_shapes, unbroadcast


def _swap_last(backend: Any, a: Any) -> Any:
    axes = list(range(a.ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return backend.transpose(a, axes)


class MatMul(Function):
    """a @ b for a, b with at least 2 dims; leading dims broadcast."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return self.backend.matmul(a, b)

    def backward(self, g):
        be = self.backend
        grad_a = grad_b = None
        if self.needs_grad(0):
            grad_a = unbroadcast(be, be.matmul(g, _swap_last(be, self.b)), self.a.shape)
        if self.needs_grad(1):
            if self.a.ndim == 2 and _is_transposed(self.b):  # a weight's .T: grad in the weight's layout
                grad_b = _swap_last(be, be.matmul(_swap_last(be, g), self.a))
            else:
                grad_b = unbroadcast(be, be.matmul(_swap_last(be, self.a), g), self.b.shape)
        return grad_a, grad_b


def _is_transposed(a: Any) -> bool:
    """Whether ``a`` is a 2-D array laid out column by column (the transpose of a
    row-major one): its gradient, computed as the transpose of a row-major product,
    then reaches that row-major array without a copy."""
    strides = getattr(a, "strides", None)
    return a.ndim == 2 and strides is not None and strides[0] < strides[1] and min(a.shape) > 1


def matmul(a: Any, b: Any) -> Tensor:
    """NumPy ``@`` semantics, including 1-D operands."""
    a = as_tensor_like(a, b, "matmul")
    b = as_tensor_like(b, a, "matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: operands must have at least 1 dim, got {a.shape} and {b.shape}")
    k_a, k_b = a.shape[-1], (b.shape[0] if b.ndim == 1 else b.shape[-2])
    if k_a != k_b:
        raise ValueError(f"matmul: inner dimensions differ: {a.shape} @ {b.shape} ({k_a} != {k_b})")
    a2 = a.unsqueeze(0) if a.ndim == 1 else a
    b2 = b.unsqueeze(-1) if b.ndim == 1 else b
    try:
        out = MatMul.apply(a2, b2)
    except ValueError:
        broadcast_shapes(f"matmul {a.shape} @ {b.shape}, batch dims", a2.shape[:-2], b2.shape[:-2])
        raise
    if b.ndim == 1:
        out = out.squeeze(-1)
    if a.ndim == 1:
        out = out.squeeze(-2 if b.ndim > 1 else -1)
    return out
