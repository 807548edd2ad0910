"""DiagonalGaussianDistribution: the VAE posterior N(mean, diag(exp(logvar)))."""

from __future__ import annotations

import math
from typing import Sequence

import tensorcore as tc
from tensorcore import Generator, Tensor


class DiagonalGaussianDistribution:
    """Built from encoder moments [B, 2C, H, W]: the first C channels are the mean, the rest
    the log-variance, clamped to [-30, 20] so ``std`` neither vanishes nor overflows.

    ``deterministic=True`` makes it a point mass at the mean (std and var zero).
    """

    def __init__(self, parameters: Tensor, deterministic: bool = False) -> None:
        if parameters.ndim < 2 or parameters.shape[1] % 2:
            raise ValueError(f"DiagonalGaussianDistribution: expected [B, 2C, ...] moments, got {parameters.shape}")
        self.parameters, self.deterministic = parameters, deterministic
        self.mean, logvar = parameters.chunk(2, axis=1)
        self.logvar = logvar.clip(-30.0, 20.0)
        if deterministic:
            self.std = self.var = tc.zeros_like(self.mean)
        else:
            self.std = tc.exp(self.logvar * 0.5)
            self.var = tc.exp(self.logvar)

    def sample(self, generator: Generator | None = None) -> Tensor:
        """mean + std * noise, the noise drawn from ``generator`` (on the moments' device)."""
        noise = tc.randn(*self.mean.shape, dtype=self.mean.dtype, device=self.mean.device, generator=generator)
        return self.mean + self.std * noise

    def mode(self) -> Tensor:
        return self.mean

    def kl(self, other: "DiagonalGaussianDistribution | None" = None) -> Tensor:
        """KL(self || other) per sample, summed over C, H, W; ``other`` defaults to N(0, I)."""
        axes = tuple(range(1, self.mean.ndim))
        if self.deterministic:
            return tc.zeros(self.mean.shape[0], dtype=self.mean.dtype, device=self.mean.device)
        if other is None:
            return (self.mean * self.mean + self.var - 1.0 - self.logvar).sum(axis=axes) * 0.5
        diff = self.mean - other.mean
        terms = diff * diff / other.var + self.var / other.var - 1.0 - self.logvar + other.logvar
        return terms.sum(axis=axes) * 0.5

    def nll(self, sample: Tensor, dims: Sequence[int] = (1, 2, 3)) -> Tensor:
        """Negative log-likelihood of ``sample``, summed over ``dims``."""
        if self.deterministic:
            return tc.zeros(sample.shape[0], dtype=sample.dtype, device=sample.device)
        diff = sample - self.mean
        return (self.logvar + diff * diff / self.var + math.log(2.0 * math.pi)).sum(axis=tuple(dims)) * 0.5
