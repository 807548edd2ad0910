"""Which training timesteps an N-step sampling run visits (diffusers' ``timestep_spacing``).

The names follow Table 2 of Lin et al. 2023 ("Common Diffusion Noise Schedules and
Sample Steps are Flawed"): ``leading`` starts at 0 and steps by T // N (plus
``steps_offset``), ``trailing`` ends at T - 1 and steps back by T / N, ``linspace``
spreads N points evenly over [0, T - 1].
"""

from __future__ import annotations

import numpy as np

SPACINGS = ("leading", "trailing", "linspace")


def spaced_timesteps(spacing: str, num_train_timesteps: int, n: int, steps_offset: int = 0,
                     round_linspace: bool = True) -> np.ndarray:
    """The N timesteps, last first, as float64 (integers unless ``round_linspace`` is off)."""
    T = num_train_timesteps
    if spacing == "linspace":
        points = np.linspace(0, T - 1, n)
        return (points.round() if round_linspace else points)[::-1].copy()
    if spacing == "leading":
        return (np.arange(0, n) * (T // n)).round()[::-1].astype(np.float64) + steps_offset
    if spacing == "trailing":  # float steps can make arange yield one more point (-1): dropped
        return (np.round(np.arange(T, 0, -T / n)) - 1)[:n]
    raise ValueError(f"timestep_spacing must be one of {SPACINGS}, got {spacing!r}")
