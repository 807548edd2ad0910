"""DiffusionConv: learned heat diffusion on a graph followed by a per-vertex linear map."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

import tensorcore as tc
import tensorcore.functional as F
from tensorcore import Tensor

from . import graph_spectrum, init
from .diffusion_functions import DirectDiffusion, SpectralDiffusion
from .module import Module
from .parameter import Parameter

TIME_FLOOR = 1e-6


class DiffusionConv(Module):
    """Graph heat diffusion at S learned times, then ``act(concat_s(diffused_s) Wᵀ + b)``.

    Input ``[B, V, C_in]`` (or ``[V, C_in]``) -> output ``[B, V, C_out]``.  ``laplacian`` is a
    symmetric ``[V, V]`` matrix (dense, or scipy-sparse); ``mass`` is optional (a positive
    ``[V]`` vector or a ``[V, V]`` matrix) and turns the problem into ``Lφ = λMφ``.

    * ``mode="spectral"``: diffused_s = Φ diag(exp(-λ t_s)) ΦᵀM x with the ``k`` smallest
      eigenpairs (default min(V, 128)), computed on first use, once, under a lock.
    * ``mode="direct"``: diffused_s = expm(-t_s M⁻¹L) x, the exact matrix exponential
      (built from the full eigendecomposition; for graphs of up to a few thousand vertices).

    Parameters: ``times [S]`` (log-spaced t_min..t_max, kept >= 1e-6 by the optimizers
    through its ``bounds``), ``weight [C_out, S*C_in]`` and ``bias [C_out]`` initialised as a
    Linear.  Replacing ``laplacian`` or ``mass`` drops the cached basis and changes
    ``structure_version``.  The basis is cached per device and dtype of the input.
    """

    def __init__(self, in_channels: int, out_channels: int, laplacian: Any, mass: Any = None, num_scales: int = 4,
                 k: int | None = None, mode: str = "spectral", activation: str = "none", bias: bool = True,
                 t_min: float = 0.01, t_max: float = 1.0, dtype: Any = tc.float32, device: str | None = None) -> None:
        super().__init__()
        if mode not in ("spectral", "direct"):
            raise ValueError(f"DiffusionConv: mode must be 'spectral' or 'direct', got {mode!r}")
        if activation not in F.ACTIVATIONS:
            raise ValueError(f"DiffusionConv: activation must be one of {F.ACTIVATIONS}, got {activation!r}")
        if min(in_channels, out_channels, num_scales) < 1 or not 0 < t_min <= t_max:
            raise ValueError(f"DiffusionConv: channels and num_scales must be positive and 0 < t_min <= t_max, "
                             f"got {in_channels}, {out_channels}, {num_scales}, {t_min}, {t_max}")
        self.in_channels, self.out_channels, self.num_scales = in_channels, out_channels, num_scales
        self.mode, self.activation = mode, activation
        object.__setattr__(self, "_lock", threading.Lock())
        self._laplacian = graph_spectrum.check_laplacian(laplacian)
        self._mass = graph_spectrum.check_mass(mass, self._laplacian.shape[0])
        self._clear_cache()
        self.k = min(self.num_vertices, 128) if k is None else k
        if not 1 <= self.k <= self.num_vertices:
            raise ValueError(f"DiffusionConv: k must be in [1, {self.num_vertices}], got {self.k}")
        times = np.logspace(math.log10(t_min), math.log10(t_max), num_scales)
        self.times = Parameter(tc.tensor(times, dtype=dtype, device=device), bounds=(TIME_FLOOR, None))
        fan_in = num_scales * in_channels
        self.weight = Parameter(tc.empty(out_channels, fan_in, dtype=dtype, device=device))
        self.bias = Parameter(tc.empty(out_channels, dtype=dtype, device=device)) if bias else None
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            init.fan_in_uniform_(self.bias, fan_in)

    # ----- the graph -------------------------------------------------------------------
    @property
    def num_vertices(self) -> int:
        return self._laplacian.shape[0]

    @property
    def laplacian(self) -> Any:
        return self._laplacian

    @laplacian.setter
    def laplacian(self, value: Any) -> None:
        laplacian = graph_spectrum.check_laplacian(value)
        if laplacian.shape[0] < self.k:
            raise ValueError(f"DiffusionConv: the new graph has {laplacian.shape[0]} vertices, fewer than k={self.k}")
        mass = graph_spectrum.check_mass(self._mass, laplacian.shape[0]) if self._mass is not None else None
        with self._lock:
            self._laplacian, self._mass = laplacian, mass
            self._clear_cache()
        self._structure_changed()

    @property
    def mass(self) -> Any:
        return self._mass

    @mass.setter
    def mass(self, value: Any) -> None:
        mass = graph_spectrum.check_mass(value, self.num_vertices)
        with self._lock:
            self._mass = mass
            self._clear_cache()
        self._structure_changed()

    def _clear_cache(self) -> None:
        object.__setattr__(self, "_host", None)
        object.__setattr__(self, "_device_cache", {})

    def _host_operators(self) -> tuple[np.ndarray, ...]:
        """Float64 host arrays the diffusion op needs; call with the lock held."""
        if self._host is None:
            if self.mode == "spectral":
                spectrum = graph_spectrum.smallest_eigenpairs(self._laplacian, self._mass, self.k)
                host = (spectrum.eigenvectors, spectrum.projection, spectrum.eigenvalues)
            else:
                spectrum = graph_spectrum.smallest_eigenpairs(self._laplacian, self._mass, self.num_vertices)
                generator = graph_spectrum.generator_matrix(self._laplacian, self._mass)
                host = (spectrum.eigenvectors, spectrum.projection, spectrum.eigenvalues, generator)
            object.__setattr__(self, "_host", host)
        return self._host

    def operators(self, device: str, dtype: Any) -> tuple[Any, ...]:
        """The backend arrays (eigenvectors, projection, eigenvalues[, generator]) on ``device``.

        Computed once per graph (thread-safe) and copied once per device and dtype.
        """
        key = (device, np.dtype(dtype))
        cached = self._device_cache.get(key)
        if cached is not None:
            return cached
        with self._lock:
            cached = self._device_cache.get(key)
            if cached is None:
                cached = tuple(tc.tensor(a, dtype=dtype, device=device).data for a in self._host_operators())
                self._device_cache[key] = cached
            return cached

    def eigenpairs(self) -> tuple[Tensor, Tensor]:
        """(eigenvalues [k], eigenvectors [V, k]) on the layer's device and dtype."""
        vectors, _, values = self.operators(self.weight.device, self.weight.dtype)[:3]
        return Tensor(values, self.weight.device), Tensor(vectors, self.weight.device)

    # ----- forward ---------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        batched = x.ndim == 3
        if x.ndim not in (2, 3) or x.shape[-2:] != (self.num_vertices, self.in_channels):
            raise ValueError(f"DiffusionConv: expected input [B, {self.num_vertices}, {self.in_channels}], got {x.shape}")
        if not batched:
            x = x.unsqueeze(0)
        times = self.times.to(dtype=x.dtype)
        operators = self.operators(x.device, x.dtype)
        op = SpectralDiffusion if self.mode == "spectral" else DirectDiffusion
        diffused = op.apply(x, times, *operators)  # [B, S, V, C]
        features = diffused.permute(0, 2, 1, 3).reshape(x.shape[0], self.num_vertices, self.num_scales * self.in_channels)
        out = F.bias_act(features @ self.weight.T, self.bias, self.activation, -1)
        return out if batched else out.squeeze(0)

    def to(self, device: Any = None, dtype: Any = None, memory_format: Any = None) -> "DiffusionConv":
        super().to(device, dtype, memory_format)
        with self._lock:  # keep the basis only where the layer now lives
            for key in [key for key in self._device_cache if key[0] != self.weight.device]:
                del self._device_cache[key]
        return self

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for name in ("_lock", "_device_cache"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_device_cache", {})

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, vertices={self.num_vertices}, scales={self.num_scales}, "
                f"mode={self.mode!r}, k={self.k}, activation={self.activation!r}")
