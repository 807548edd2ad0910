"""Layer, group and batch normalisation, forward and backward.

Each normalises ``x`` over some axes to ``xhat = (x - mean) * rstd`` with the biased
variance (``rstd = 1 / sqrt(var + eps)``) and then applies a per-feature affine map.
The backward of every one of them shares ``_normalized_input_grad``:

    dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))

with the means over the normalised axes.  Weight gradients are returned when there is
a weight; the bias gradient (the plain sum of the gradient) is returned for layer and
batch norm always, since their backward is not told whether a bias exists.
"""

from __future__ import annotations

import math
from typing import Any

from .act import NumpyActivationKernels

Array = Any


class NumpyNormKernels(NumpyActivationKernels):
    """layer_norm / group_norm / batch_norm for any NumPy-like ``xp`` (group norm
    fuses an activation, hence the base class)."""

    xp: Any

    @staticmethod
    def _moments(x: Array, axes: tuple[int, ...]) -> tuple[Array, Array]:
        """(mean, biased variance) of x over ``axes``, kept as size-1 axes."""
        mean = x.mean(axis=axes, keepdims=True)
        centred = x - mean
        return mean, (centred * centred).mean(axis=axes, keepdims=True)

    @staticmethod
    def _update_running_stats(running_mean: Array | None, running_var: Array | None, mean: Array,
                              var: Array, count: int, momentum: float) -> None:
        """Blend batch statistics into the running ones in place (unbiased variance, as
        PyTorch); either running buffer may be absent."""
        if running_mean is not None:
            running_mean[...] = (1.0 - momentum) * running_mean + momentum * mean
        if running_var is not None:
            running_var[...] = (1.0 - momentum) * running_var + momentum * (var * (count / (count - 1)))

    def _rstd(self, var: Array, eps: float) -> Array:
        return 1.0 / self.xp.sqrt(var + eps)

    @staticmethod
    def _normalized_input_grad(dxhat: Array, xhat: Array, rstd: Array,
                               axes: tuple[int, ...]) -> Array:
        """Gradient w.r.t. x of xhat = (x - mean(x)) * rstd(x), given d loss / d xhat."""
        mean_d = dxhat.mean(axis=axes, keepdims=True)
        mean_dx = (dxhat * xhat).mean(axis=axes, keepdims=True)
        return rstd * (dxhat - mean_d - xhat * mean_dx)

    @staticmethod
    def _check_param(op: str, name: str, p: Array | None, shape: tuple) -> None:
        if p is not None and tuple(p.shape) != tuple(shape):
            raise ValueError(f"{op}: {name} has shape {tuple(p.shape)}, expected "
                             f"{tuple(shape)}")

    @staticmethod
    def _affine(xhat: Array, weight: Array | None, bias: Array | None,
                shape: tuple) -> Array:
        """xhat * weight + bias with both reshaped to ``shape``; either may be None."""
        if weight is not None:
            xhat = xhat * weight.reshape(shape)
        if bias is not None:
            xhat = xhat + bias.reshape(shape)
        return xhat

    # ----- layer norm ----------------------------------------------------------------
    @staticmethod
    def _layer_rows(op: str, x: Array, n_norm: int) -> tuple[int, int]:
        """(rows, features) of x viewed as [rows, prod(last n_norm axes)]."""
        if not 0 < n_norm <= x.ndim:
            raise ValueError(f"{op}: n_norm={n_norm} must be in 1..{x.ndim} for x of "
                             f"shape {x.shape}")
        return math.prod(x.shape[:-n_norm]), math.prod(x.shape[-n_norm:])

    def layer_norm(self, x: Array, weight: Array | None, bias: Array | None,
                   n_norm: int, eps: float) -> tuple[Array, Array, Array]:
        """Normalise over the last ``n_norm`` axes; returns (y, mean, rstd) with
        mean/rstd shaped [rows]."""
        rows, feats = self._layer_rows("layer_norm", x, n_norm)
        for name, p in (("weight", weight), ("bias", bias)):
            self._check_param("layer_norm", name, p, x.shape[-n_norm:])
        xr = x.reshape(rows, feats)
        mean, var = self._moments(xr, (1,))
        rstd = self._rstd(var, eps)
        y = self._affine((xr - mean) * rstd, weight, bias, (feats,))
        return y.reshape(x.shape), mean.reshape(rows), rstd.reshape(rows)

    def layer_norm_backward(self, grad: Array, x: Array, weight: Array | None,
                            mean: Array, rstd: Array, n_norm: int
                            ) -> tuple[Array, Array | None, Array | None]:
        """(dx, dweight or None without a weight, dbias)."""
        rows, feats = self._layer_rows("layer_norm_backward", x, n_norm)
        norm_shape = x.shape[-n_norm:]
        xr, gr = x.reshape(rows, feats), grad.reshape(rows, feats)
        rstd = rstd.reshape(rows, 1)
        xhat = (xr - mean.reshape(rows, 1)) * rstd
        dbias = gr.sum(axis=0).reshape(norm_shape)
        dweight = None
        dxhat = gr
        if weight is not None:
            dweight = (gr * xhat).sum(axis=0).reshape(norm_shape)
            dxhat = gr * weight.reshape(feats)
        dx = self._normalized_input_grad(dxhat, xhat, rstd, (1,))
        return dx.reshape(x.shape), dweight, dbias

    # ----- group norm ----------------------------------------------------------------
    @staticmethod
    def _check_groups(op: str, x: Array, groups: int) -> None:
        if x.ndim < 2 or groups < 1 or x.shape[1] % groups:
            raise ValueError(f"{op}: x of shape {x.shape} cannot be split into "
                             f"{groups} channel groups")

    @staticmethod
    def _shift_planes(op: str, x: Array, shift: Array) -> Array:
        """``shift`` [N, C] viewed as [N, C, 1, ...] to broadcast over x [N, C, *]."""
        if x.ndim < 2 or tuple(shift.shape) != tuple(x.shape[:2]) or shift.dtype != x.dtype:
            raise ValueError(f"{op}: shift must be [N, C] = {tuple(x.shape[:2])} of x's dtype "
                             f"{x.dtype}, got shape {tuple(shift.shape)} of {shift.dtype}")
        return shift.reshape(tuple(shift.shape) + (1,) * (x.ndim - 2))

    def _group_view(self, op: str, x: Array, groups: int) -> Array:
        """x [N, C, *] viewed as [N, groups, C/groups * prod(*)]."""
        self._check_groups(op, x, groups)
        return x.reshape(x.shape[0], groups, math.prod(x.shape[1:]) // groups)

    def group_norm(self, x: Array, weight: Array | None, bias: Array | None,
                   groups: int, eps: float, act: str = "none", shift: Array | None = None
                   ) -> tuple[Array, Array, Array]:
        """x [N, C, *]; returns (act(y), mean, rstd), mean/rstd shaped [N, groups].
        ``shift`` [N, C] is added to x first (the backend's own broadcast add)."""
        if shift is not None:
            x = self.binary("add", x, self._shift_planes("group_norm", x, shift))
        xg = self._group_view("group_norm", x, groups)
        for name, p in (("weight", weight), ("bias", bias)):
            self._check_param("group_norm", name, p, x.shape[1:2])
        mean, var = self._moments(xg, (2,))
        rstd = self._rstd(var, eps)
        xhat = ((xg - mean) * rstd).reshape(x.shape)
        y = self._affine(xhat, weight, bias, _channel_shape(x.ndim, x.shape[1]))
        return self.apply_activation(act, y), mean[..., 0], rstd[..., 0]

    def group_norm_backward(self, grad: Array, x: Array, weight: Array | None,
                            bias: Array | None, mean: Array, rstd: Array, groups: int,
                            act: str = "none"
                            ) -> tuple[Array, Array | None, Array | None]:
        """(dx, dweight, dbias) of ``group_norm``, differentiating through ``act``."""
        xg = self._group_view("group_norm_backward", x, groups)
        rstd = rstd[..., None]
        xhat = ((xg - mean[..., None]) * rstd).reshape(x.shape)
        channel = _channel_shape(x.ndim, x.shape[1])
        if act != "none":
            grad = self.activation_grad(act, self._affine(xhat, weight, bias, channel), grad)
        other = _all_but_channel(x.ndim)
        dbias = None if bias is None else grad.sum(axis=other)
        dweight = None if weight is None else (grad * xhat).sum(axis=other)
        dxhat = grad if weight is None else grad * weight.reshape(channel)
        dx = self._normalized_input_grad(dxhat.reshape(xg.shape), xhat.reshape(xg.shape),
                                         rstd, (2,))
        return dx.reshape(x.shape), dweight, dbias

    # ----- batch norm ----------------------------------------------------------------
    def batch_norm(self, x: Array, weight: Array | None, bias: Array | None,
                   running_mean: Array | None, running_var: Array | None,
                   training: bool, momentum: float, eps: float
                   ) -> tuple[Array, Array, Array]:
        """x [N, C, *].  Training: batch statistics, running stats updated in place
        (unbiased variance, as PyTorch).  Eval: the running statistics.  Returns
        (y, mean[C], rstd[C])."""
        if x.ndim < 2:
            raise ValueError(f"batch_norm: expected x [N, C, *], got shape {x.shape}")
        channels = x.shape[1]
        for name, p in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                        ("running_var", running_var)):
            self._check_param("batch_norm", name, p, (channels,))
        channel = _channel_shape(x.ndim, channels)
        if training:
            count = x.size // channels if channels else 0
            if count < 2:
                raise ValueError(f"batch_norm: training needs more than one value per "
                                 f"channel, got x of shape {x.shape}")
            mean, var = self._moments(x, _all_but_channel(x.ndim))
            mean, var = mean.reshape(channels), var.reshape(channels)
            rstd = self._rstd(var, eps)
            self._update_running_stats(running_mean, running_var, mean, var, count, momentum)
        else:
            if running_mean is None or running_var is None:
                raise ValueError("batch_norm: eval mode needs running_mean and running_var")
            mean = running_mean.astype(x.dtype)
            rstd = self._rstd(running_var, eps).astype(x.dtype, copy=False)
        xhat = (x - mean.reshape(channel)) * rstd.reshape(channel)
        return self._affine(xhat, weight, bias, channel), mean, rstd

    def batch_norm_backward(self, grad: Array, x: Array, weight: Array | None,
                            mean: Array, rstd: Array, training: bool
                            ) -> tuple[Array, Array | None, Array | None]:
        """(dx, dweight or None without a weight, dbias).  In eval mode the statistics
        are constants, so dx is just the affine map's gradient."""
        channel = _channel_shape(x.ndim, x.shape[1])
        other = _all_but_channel(x.ndim)
        rstd = rstd.reshape(channel)
        xhat = (x - mean.reshape(channel)) * rstd
        dbias = grad.sum(axis=other)
        dweight = None if weight is None else (grad * xhat).sum(axis=other)
        dxhat = grad if weight is None else grad * weight.reshape(channel)
        if training:
            return self._normalized_input_grad(dxhat, xhat, rstd, other), dweight, dbias
        return dxhat * rstd, dweight, dbias


def _channel_shape(ndim: int, channels: int) -> tuple[int, ...]:
    """Shape that broadcasts a [C] vector along axis 1 of an ndim-array."""
    return (1, channels) + (1,) * (ndim - 2)


def _all_but_channel(ndim: int) -> tuple[int, ...]:
    return (0,) + tuple(range(2, ndim))
