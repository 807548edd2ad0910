"""Linear: y = x Wᵀ + b over the last axis."""

from __future__ import annotations

import math

import tensorcore as tc
import tensorcore.functional as F
from tensorcore import Tensor

from . import init
from .module import Module
from .parameter import Parameter


class Linear(Module):
    """``[*, in_features] -> [*, out_features]``; weight ``[out, in]``, bias ``[out]`` (as PyTorch).

    Initialised as PyTorch: weight ``kaiming_uniform_(a=sqrt(5))``, bias U(-1/sqrt(in), 1/sqrt(in)).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: object = tc.float32,
                 device: str | None = None) -> None:
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"Linear: in_features and out_features must be positive, got {in_features}, {out_features}")
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(tc.empty(out_features, in_features, dtype=dtype, device=device))
        self.bias = Parameter(tc.empty(out_features, dtype=dtype, device=device)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            init.fan_in_uniform_(self.bias, self.in_features)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"Linear: expected input [..., {self.in_features}], got {x.shape}")
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
