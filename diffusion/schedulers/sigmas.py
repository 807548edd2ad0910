"""Noise levels σ = sqrt((1 - ᾱ) / ᾱ) and the σ schedules of the Karras-style samplers.

Host NumPy, as diffusers computes them (its ``set_timesteps`` works in NumPy too).
"""

from __future__ import annotations

import math

import numpy as np


def train_sigmas(alphas_cumprod: np.ndarray) -> np.ndarray:
    """σ of every training timestep (float32, ascending in t)."""
    return np.sqrt((1 - alphas_cumprod) / alphas_cumprod)


def sigma_to_t(sigmas: np.ndarray, log_sigmas: np.ndarray) -> np.ndarray:
    """The fractional training timestep of each σ: linear interpolation in log σ."""
    log_sigma = np.log(np.maximum(sigmas, 1e-10))
    dists = log_sigma - log_sigmas[:, np.newaxis]
    low = np.cumsum(dists >= 0, axis=0).argmax(axis=0).clip(max=log_sigmas.shape[0] - 2)
    high = low + 1
    w = np.clip((log_sigmas[low] - log_sigma) / (log_sigmas[low] - log_sigmas[high]), 0, 1)
    return ((1 - w) * low + w * high).reshape(np.shape(sigmas))


def karras_sigmas(sigma_min: float, sigma_max: float, n: int, rho: float = 7.0) -> np.ndarray:
    """``n`` σ from ``sigma_max`` down to ``sigma_min``, even in σ^(1/ρ) (Karras et al. 2022)."""
    ramp = np.linspace(0, 1, n)
    min_inv, max_inv = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return (max_inv + ramp * (min_inv - max_inv)) ** rho


def exponential_sigmas(sigma_min: float, sigma_max: float, n: int) -> np.ndarray:
    """``n`` σ from ``sigma_max`` down to ``sigma_min``, even in log σ."""
    return np.exp(np.linspace(math.log(sigma_max), math.log(sigma_min), n))
