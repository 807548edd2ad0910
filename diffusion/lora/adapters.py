"""Layers that add any number of named LoRA adapters to a Linear or a Conv2d.

``LoraLinear`` and ``LoraConv2d`` subclass the layer they adapt and take over its
Parameter objects, so the parameter names, ``state_dict`` and the base forward stay those
of the plain layer.  Each adapter is a pair of non-persistent buffers (inference only) in
the base weight's dtype and device, ``lora_A_<name>`` and ``lora_B_<name>``.

The forward adds ``update(x) * scale`` to the base output for every active adapter -- for
a Linear ``((x @ A) @ B) * scale`` with ``A [in, r]`` and ``B [r, out]``, the pattern
``tc.compile`` rewrites into one fused call when a single adapter is active.  ``scale`` is
a Python float: adapter weight × alpha / rank × the pipeline's LoRA scale.  ``fuse`` adds
the updates into the base weight (the forward is then the base alone) and keeps the
original weight for ``unfuse``; ``plain`` hands back the layer that was adapted.  Every
change bumps the structure version, so compiled plans retrace.
"""

from __future__ import annotations

import abc

from typing import Mapping

import numpy as np

import tensorcore as tc
import tensorcore.functional as F
from layers import Conv2d, Linear, Module
from tensorcore import Tensor

from .weights import LoraWeights

UNFUSED = "unfused_weight"  # the buffer keeping the weight as it was before fuse()


class LoraLayer(Module, abc.ABC):
    """What LoraLinear and LoraConv2d share; subclasses say how factors are laid out and applied."""

    def __init__(self, base: Module) -> None:
        Module.__init__(self)  # not the base class's own __init__: the parameters stay base's
        for name, value in vars(base).items():
            if not name.startswith("_"):  # in_features, stride, training ... (bias when None)
                object.__setattr__(self, name, value)
        for name, param in base._parameters.items():
            self.register_parameter(name, param)
        object.__setattr__(self, "_base", base)  # a plain attribute, not a submodule
        self._scales: dict[str, float] = {}  # adapter name -> alpha / rank
        self._terms: tuple[tuple[str, float], ...] = ()  # (active adapter, its full scale)

    # ----- what a subclass defines ---------------------------------------------------------
    @staticmethod
    @abc.abstractmethod
    def factor_shapes(base: Module, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes of ``down`` and ``up`` (as ``LoraWeights`` holds them) for ``base``."""

    @abc.abstractmethod
    def _factors(self, weights: LoraWeights) -> tuple[np.ndarray, np.ndarray]:
        """``down`` and ``up`` laid out as this layer stores them (A and B)."""

    @abc.abstractmethod
    def _update(self, x: Tensor, a: Tensor, b: Tensor) -> Tensor:
        """One adapter's addition to the output, before scaling."""

    @abc.abstractmethod
    def _delta(self, a: Tensor, b: Tensor) -> Tensor:
        """One adapter's update as a weight, shaped like ``weight``, before scaling."""

    # ----- adapters ------------------------------------------------------------------------
    @property
    def adapter_names(self) -> list[str]:
        return list(self._scales)

    @property
    def fused(self) -> bool:
        return self._buffers.get(UNFUSED) is not None

    def add_adapter(self, name: str, weights: LoraWeights) -> None:
        """Hold ``weights`` as the adapter ``name`` (inactive until ``set_active`` names it)."""
        like = self.weight
        a, b = (tc.tensor(np.ascontiguousarray(factor), dtype=like.dtype, device=like.device)
                for factor in self._factors(weights))
        self.register_buffer(f"lora_A_{name}", a, persistent=False)
        self.register_buffer(f"lora_B_{name}", b, persistent=False)
        self._scales[name] = weights.scale

    def delete_adapter(self, name: str) -> None:
        delattr(self, f"lora_A_{name}")
        delattr(self, f"lora_B_{name}")
        del self._scales[name]
        self._terms = tuple(term for term in self._terms if term[0] != name)

    def set_active(self, weights: Mapping[str, float]) -> None:
        """Apply the adapters named in ``weights`` (those this layer holds), each at its weight
        times its alpha / rank; a change bumps the structure version."""
        terms = tuple((name, weight * self._scales[name]) for name, weight in weights.items() if name in self._scales)
        if terms != self._terms:
            self._terms = terms
            self._structure_changed()

    def _pair(self, name: str) -> tuple[Tensor, Tensor]:
        return self._buffers[f"lora_A_{name}"], self._buffers[f"lora_B_{name}"]

    def forward(self, x: Tensor) -> Tensor:
        y = super().forward(x)
        if self.fused:
            return y
        for name, scale in self._terms:
            y = y + self._update(x, *self._pair(name)) * scale
        return y

    # ----- fusing --------------------------------------------------------------------------
    def fuse(self, weights: Mapping[str, float]) -> None:
        """Add the adapters named in ``weights`` that this layer holds into the base weight,
        each at its weight times its alpha / rank, keeping the weight as it was for ``unfuse``."""
        held = [(name, weight * self._scales[name]) for name, weight in weights.items() if name in self._scales]
        if self.fused or not held:
            return
        with tc.no_grad():
            self.register_buffer(UNFUSED, self.weight.detach().clone(), persistent=False)
            for name, scale in held:
                self.weight.add_(self._delta(*self._pair(name)), alpha=scale)

    def unfuse(self) -> None:
        """Restore the weight ``fuse`` changed, bit for bit."""
        if self.fused:
            with tc.no_grad():
                self.weight.copy_(self._buffers[UNFUSED])
            delattr(self, UNFUSED)

    def plain(self) -> Module:
        """The layer this one adapts, with its original weight and this layer's training flag."""
        self.unfuse()
        object.__setattr__(self._base, "training", self.training)
        return self._base

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, adapters={self.adapter_names}, fused={self.fused}"


class LoraLinear(LoraLayer, Linear):
    """A Linear with LoRA adapters, stored as ``A = down.T [in, r]`` and ``B = up.T [r, out]``."""

    @staticmethod
    def factor_shapes(base: Linear, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (rank, base.in_features), (base.out_features, rank)

    def _factors(self, weights: LoraWeights) -> tuple[np.ndarray, np.ndarray]:
        return weights.down.T, weights.up.T

    def _update(self, x: Tensor, a: Tensor, b: Tensor) -> Tensor:
        return (x @ a) @ b

    def _delta(self, a: Tensor, b: Tensor) -> Tensor:
        return (a @ b).T


class LoraConv2d(LoraLayer, Conv2d):
    """A Conv2d with LoRA adapters: ``A = down [r, in, kh, kw]``, a convolution with the base's
    stride, padding and dilation, then ``B = up [out, r, 1, 1]``, a 1×1 convolution."""

    @staticmethod
    def factor_shapes(base: Conv2d, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (rank, base.in_channels, *base.kernel_size), (base.out_channels, rank, 1, 1)

    def _factors(self, weights: LoraWeights) -> tuple[np.ndarray, np.ndarray]:
        return weights.down, weights.up

    def _update(self, x: Tensor, a: Tensor, b: Tensor) -> Tensor:
        return F.conv2d(F.conv2d(x, a, None, self.stride, self.padding, self.dilation), b)

    def _delta(self, a: Tensor, b: Tensor) -> Tensor:
        rank = a.shape[0]
        return (b.reshape(b.shape[0], rank) @ a.reshape(rank, -1)).reshape(*self.weight.shape)


def adapter_class(module: Module) -> type[LoraLayer] | None:
    """The adapter layer for ``module`` (its own class when already adapted); None when LoRA
    cannot adapt it (anything but a plain Linear or an ungrouped Conv2d)."""
    if isinstance(module, LoraLayer):
        return type(module)
    if type(module) is Conv2d and module.groups == 1:
        return LoraConv2d
    return LoraLinear if type(module) is Linear else None
