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


class Linear(Function):
    """x Wᵀ + b over the last axis of x [*, in], W [out, in], b [out] or None: a Linear
    layer's product and bias as one node.  The forward makes the backend calls that
    ``x @ W.T`` and ``bias_act`` make (a 1-D x multiplied as one row), so compiled graphs
    see the same calls; the backward works on the gradient as 2-D rows."""

    def forward(self, x, w, b):
        be = self.backend
        self.x, self.w, self.has_bias = x, w, b is not None
        rows = x if x.ndim > 1 else be.reshape(x, (1, x.shape[0]))
        y = be.matmul(rows, be.transpose(w, (1, 0)))
        if x.ndim == 1:
            y = be.reshape(y, (w.shape[0],))
        return y if b is None else be.bias_act(y, b, "none", -1)

    def backward(self, g):
        be = self.backend
        out_features, in_features = self.w.shape
        rows = be.reshape(g, (-1, out_features))
        grad_x = be.reshape(be.matmul(rows, self.w), self.x.shape) if self.needs_grad(0) else None
        grad_w = (be.matmul(be.transpose(rows, (1, 0)), be.reshape(self.x, (-1, in_features)))
                  if self.needs_grad(1) else None)
        grad_b = be.reduce("sum", rows, (0,), False) if self.has_bias else None
        return grad_x, grad_w, grad_b


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


def linear(x: Any, weight: Any, bias: Any = None) -> Tensor:
    """``x @ weight.T + bias`` as ``torch.nn.functional.linear``: x [*, in] (or [in]),
    weight [out, in], bias [out] or None."""
    x = as_tensor_like(x, weight, "linear")
    if weight.ndim != 2:
        raise ValueError(f"linear: weight must be [out_features, in_features], got {weight.shape}")
    if x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input {x.shape} must end in in_features={weight.shape[1]} of weight {weight.shape}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"linear: bias must have shape ({weight.shape[0]},) for weight {weight.shape}, got {bias.shape}")
    return Linear.apply(x, weight, bias)
