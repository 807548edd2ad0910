"""Softmax family and the fused bias + activation."""

from __future__ import annotations

from ..autograd import Function
from ..backends.base import ACTIVATIONS
from ..tensor import Tensor
from .movement import transpose
from .shape_utils import normalize_axis, torch_spelling


class Softmax(Function):
    def forward(self, x):
        self.y = self.backend.softmax(x)
        return self.y

    def backward(self, g):
        return (self.backend.softmax_backward(g, self.y),)


class LogSoftmax(Function):
    def forward(self, x):
        self.y = self.backend.log_softmax(x)
        return self.y

    def backward(self, g):
        return (self.backend.log_softmax_backward(g, self.y),)


def _last_axis(fn: type[Function], x: Tensor, axis: int | None, dim: int | None, op: str) -> Tensor:
    """Run a last-axis kernel over any axis (default the last) by swapping that axis to the end."""
    axis, _ = torch_spelling(op, axis, False, dim, None)
    if x.ndim == 0:
        raise ValueError(f"{op}: needs at least one dimension")
    axis = normalize_axis(-1 if axis is None else axis, x.ndim, op)
    if axis == x.ndim - 1:
        return fn.apply(x)
    return transpose(fn.apply(transpose(x, axis, -1)), axis, -1)


def softmax(x: Tensor, axis: int | None = None, *, dim: int | None = None) -> Tensor:
    """Softmax over ``axis`` (PyTorch's ``dim``), the last axis by default."""
    return _last_axis(Softmax, x, axis, dim, "softmax")


def log_softmax(x: Tensor, axis: int | None = None, *, dim: int | None = None) -> Tensor:
    """Log-softmax over ``axis`` (PyTorch's ``dim``), the last axis by default."""
    return _last_axis(LogSoftmax, x, axis, dim, "log_softmax")


class BiasAct(Function):
    def forward(self, x, bias, act, axis):
        self.x, self.bias, self.act, self.axis = x, bias, act, axis
        return self.backend.bias_act(x, bias, act, axis)

    def backward(self, g):
        gx, gb = self.backend.bias_act_backward(g, self.x, self.bias, self.act, self.axis)
        return gx, gb, None, None


def bias_act(x: Tensor, bias: Tensor | None, act: str = "none", axis: int = -1) -> Tensor:
    """act(x + bias) in one kernel; ``bias`` is 1-D along ``axis`` of x."""
    if act not in ACTIVATIONS:
        raise ValueError(f"bias_act: act must be one of {ACTIVATIONS}, got {act!r}")
    axis = normalize_axis(axis, x.ndim, "bias_act")
    if bias is not None and bias.shape != (x.shape[axis],):
        raise ValueError(f"bias_act: bias must have shape ({x.shape[axis]},) for axis {axis} of {x.shape}, got {bias.shape}")
    return BiasAct.apply(x, bias, act, axis)
