"""Beta schedules and ᾱ, computed in float32 on the host as diffusers computes them.

diffusers builds these tables with torch in float32; the same operations in NumPy give
the same values up to rounding: torch's ``cumprod`` accumulates in float64, so this one
does too, while NumPy's ``linspace`` and ``sqrt`` are correctly rounded where torch's
may be one float32 ulp off.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

F32 = np.float32


def _linspace32(start: float, end: float, n: int) -> np.ndarray:
    return np.linspace(start, end, n, dtype=np.float64).astype(F32)


def _cosine(t: float) -> float:
    return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2


def _laplace(t: float) -> float:
    lmb = -0.5 * math.copysign(1, 0.5 - t) * math.log(1 - 2 * math.fabs(0.5 - t) + 1e-6)
    snr = math.exp(lmb)
    return math.sqrt(snr / (1 + snr))


def betas_for_alpha_bar(n: int, alpha_bar: Callable[[float], float] = _cosine, max_beta: float = 0.999) -> np.ndarray:
    """Betas that discretize ᾱ(t) on [0, 1] into ``n`` steps, each capped at ``max_beta``."""
    betas = [min(1 - alpha_bar((i + 1) / n) / alpha_bar(i / n), max_beta) for i in range(n)]
    return np.array(betas, dtype=F32)


def beta_schedule(schedule: str, n: int, beta_start: float, beta_end: float,
                  trained_betas: Sequence[float] | None = None) -> np.ndarray:
    """The float32 betas of a named schedule (``trained_betas``, when given, win)."""
    if trained_betas is not None:
        return np.asarray(trained_betas, dtype=F32)
    if schedule == "linear":
        return _linspace32(beta_start, beta_end, n)
    if schedule == "scaled_linear":  # latent diffusion's schedule: linear in sqrt(beta)
        return _linspace32(beta_start ** 0.5, beta_end ** 0.5, n) ** 2
    if schedule == "squaredcos_cap_v2":  # Glide's cosine schedule
        return betas_for_alpha_bar(n)
    if schedule == "laplace":
        return betas_for_alpha_bar(n, _laplace)
    if schedule == "sigmoid":
        x = _linspace32(-6, 6, n)
        return (F32(1) / (F32(1) + np.exp(-x))) * F32(beta_end - beta_start) + F32(beta_start)
    raise ValueError(f"unknown beta_schedule {schedule!r}")


def cumprod(alphas: np.ndarray) -> np.ndarray:
    """Running product of float32 ``alphas``, accumulated in float64 as torch does."""
    return np.cumprod(alphas.astype(np.float64)).astype(F32)


def rescale_zero_terminal_snr(betas: np.ndarray) -> np.ndarray:
    """Betas whose last ᾱ is exactly 0 (zero terminal SNR), keeping the first ᾱ.

    Shifts and scales sqrt(ᾱ) linearly (Lin et al. 2023, "Common Diffusion Noise
    Schedules and Sample Steps are Flawed", Algorithm 1).
    """
    root = np.sqrt(cumprod(F32(1) - betas))
    first, last = root[0].copy(), root[-1].copy()
    root = (root - last) * (first / (first - last))
    alphas_bar = root ** 2
    alphas = np.concatenate([alphas_bar[:1], alphas_bar[1:] / alphas_bar[:-1]])
    return F32(1) - alphas
