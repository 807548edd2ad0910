"""Activations by name, their gradients, and the fused bias + activation kernel.

Written against ``self.xp`` so the CuPy backend inherits a working version.
"""

from __future__ import annotations

import math
from typing import Any

from ..base import ACTIVATIONS
from .special import erf

Array = Any


_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TANH_GELU_SCALE = math.sqrt(2.0 / math.pi)
_TANH_GELU_CUBIC = 0.044715


def check_activation(op: str, act: str) -> None:
    """Raise a ValueError naming ``op`` when ``act`` is not a known activation."""
    if act not in ACTIVATIONS:
        raise ValueError(f"{op}: unknown activation {act!r}; expected one of {ACTIVATIONS}")


class NumpyActivationKernels:
    """Activation forward/backward and bias + activation, for any NumPy-like ``xp``."""

    xp: Any

    def _stable_sigmoid(self, x: Array) -> Array:
        """1 / (1 + exp(-x)) without overflow, as 0.5 * (1 + tanh(x / 2))."""
        return 0.5 * (1.0 + self.xp.tanh(0.5 * x))

    def apply_activation(self, act: str, x: Array) -> Array:
        """act(x) for an activation named in ``ACTIVATIONS``."""
        xp = self.xp
        check_activation("apply_activation", act)
        if act == "none":
            return x
        if act == "relu":
            return xp.maximum(x, 0)
        if act == "gelu":
            return x * (0.5 * (1.0 + erf(xp, x * _SQRT_HALF)))
        if act == "gelu_tanh":
            inner = _TANH_GELU_SCALE * (x + _TANH_GELU_CUBIC * x * x * x)
            return 0.5 * x * (1.0 + xp.tanh(inner))
        if act == "silu":
            return x * self._stable_sigmoid(x)
        if act == "sigmoid":
            return self._stable_sigmoid(x)
        return xp.tanh(x)

    def activation_grad(self, act: str, x: Array, grad: Array) -> Array:
        """d act(x)/dx * grad, where ``x`` is the activation's input."""
        xp = self.xp
        check_activation("activation_grad", act)
        if act == "none":
            return grad
        if act == "relu":
            return grad * (x > 0)  # a mask product: several times faster than where
        if act == "gelu":
            cdf = 0.5 * (1.0 + erf(xp, x * _SQRT_HALF))
            pdf = _INV_SQRT_2PI * xp.exp(-0.5 * x * x)
            return grad * (cdf + x * pdf)
        if act == "gelu_tanh":
            t = xp.tanh(_TANH_GELU_SCALE * (x + _TANH_GELU_CUBIC * x * x * x))
            d_inner = _TANH_GELU_SCALE * (1.0 + 3.0 * _TANH_GELU_CUBIC * x * x)
            return grad * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner)
        if act == "silu":
            s = self._stable_sigmoid(x)
            return grad * (s * (1.0 + x * (1.0 - s)))
        if act == "sigmoid":
            s = self._stable_sigmoid(x)
            return grad * (s * (1.0 - s))
        t = xp.tanh(x)
        return grad * (1.0 - t * t)

    def _bias_along(self, op: str, x: Array, bias: Array, axis: int) -> Array:
        """``bias`` reshaped to broadcast along ``axis`` of ``x``."""
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"{op}: axis {axis} out of range for x of shape {x.shape}")
        axis %= x.ndim
        if bias.ndim != 1 or bias.shape[0] != x.shape[axis]:
            raise ValueError(f"{op}: bias of shape {bias.shape} does not match axis {axis} "
                             f"of x with shape {x.shape}")
        shape = [1] * x.ndim
        shape[axis] = bias.shape[0]
        return bias.reshape(shape)

    def bias_act(self, x: Array, bias: Array | None, act: str, axis: int) -> Array:
        """act(x + bias) where bias is 1-D and lies along ``axis`` of x."""
        check_activation("bias_act", act)
        if bias is not None:
            x = x + self._bias_along("bias_act", x, bias, axis)
        return self.apply_activation(act, x)

    def bias_act_backward(self, grad: Array, x: Array, bias: Array | None, act: str,
                          axis: int) -> tuple[Array, Array | None]:
        """(d x, d bias) of ``bias_act``; d bias is None when there is no bias."""
        check_activation("bias_act_backward", act)
        if bias is None:
            return self.activation_grad(act, x, grad), None
        bias_b = self._bias_along("bias_act_backward", x, bias, axis)
        gx = grad if act == "none" else self.activation_grad(act, x + bias_b, grad)
        axis %= x.ndim
        other = tuple(i for i in range(x.ndim) if i != axis)
        return gx, gx.sum(axis=other).astype(bias.dtype, copy=False)
