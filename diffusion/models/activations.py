"""The activations diffusers' blocks name in their configs (``act_fn``), GroupNorm fused with one, and GEGLU."""

from __future__ import annotations

from typing import Callable

import tensorcore.functional as F
from layers import GroupNorm, Linear, Module
from tensorcore import Tensor


def _mish(x: Tensor) -> Tensor:
    return x * F.tanh(F.softplus(x))


# act_fn -> (function, the name group_norm's fused epilogue knows it by, or None)
_ACTIVATIONS: dict[str, tuple[Callable[[Tensor], Tensor], str | None]] = {
    "silu": (F.silu, "silu"),
    "swish": (F.silu, "silu"),
    "gelu": (F.gelu, "gelu"),
    "relu": (F.relu, "relu"),
    "mish": (_mish, None),
}


def check_activation(act_fn: str, owner: str) -> str:
    """``act_fn`` lower-cased, or a ValueError naming the valid names."""
    name = act_fn.lower() if isinstance(act_fn, str) else act_fn
    if name not in _ACTIVATIONS:
        raise ValueError(f"{owner}: act_fn must be one of {sorted(_ACTIVATIONS)}, got {act_fn!r}")
    return name


def activation(act_fn: str) -> Callable[[Tensor], Tensor]:
    """The function named ``act_fn`` (already checked by ``check_activation``)."""
    return _ACTIVATIONS[act_fn][0]


def group_norm_act(norm: GroupNorm, x: Tensor, act_fn: str) -> Tensor:
    """``act(norm(x))``, as one fused kernel where the backend has the activation as an epilogue."""
    fn, fused = _ACTIVATIONS[act_fn]
    if fused is None:
        return fn(norm(x))
    return F.group_norm(x, norm.num_groups, norm.weight, norm.bias, norm.eps, act=fused)


class GEGLU(Module):
    """The gated GELU of diffusers' transformer feed-forward: ``a * gelu(b)`` for ``[a | b] = proj(x)``.

    ``proj`` maps ``dim_in`` to ``2 * dim_out`` channels (diffusers' ``GEGLU.proj``).
    """

    def __init__(self, dim_in: int, dim_out: int, bias: bool = True) -> None:
        super().__init__()
        self.proj = Linear(dim_in, 2 * dim_out, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return F.gated_activation(self.proj(x), "gelu")
