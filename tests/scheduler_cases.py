"""Shared inputs for the scheduler tests: diffusers' deterministic sample and dummy model,
and a sampling loop that runs one of our schedulers (or diffusers') on host arrays."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

import tensorcore as tc

# T = 1000, linear betas 1e-4..0.02, clip_sample: diffusers' test config for DDPM/DDIM
REFERENCE_CONFIG = {"num_train_timesteps": 1000, "beta_start": 0.0001, "beta_end": 0.02,
                    "beta_schedule": "linear", "clip_sample": True}


def deterministic_sample() -> tc.Tensor:
    """arange(768) / 768 laid out as (3, 8, 8, 4) and permuted to (4, 3, 8, 8), as diffusers' tests."""
    return tc.tensor((np.arange(768).reshape(3, 8, 8, 4) / 768).astype(np.float32)).permute(3, 0, 1, 2)


def dummy_model(sample: tc.Tensor, t: Any) -> tc.Tensor:
    """diffusers' test model: sample * t / (t + 1)."""
    t = float(t)
    return sample * (t / (t + 1))


def smooth_model(x: np.ndarray, t: float) -> np.ndarray:
    """A deterministic stand-in for a network: bounded, smooth, timestep-dependent."""
    return (0.9 * np.tanh(x) + 0.05 * np.cos(3.0 * x + t / 250.0)).astype(np.float32)


def start_sample(shape: tuple[int, ...] = (2, 3, 4, 4), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def step_noises(count: int, shape: tuple[int, ...] = (2, 3, 4, 4), seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(count)]


def sample_loop(run: Any, x: np.ndarray, noises: list[np.ndarray] | None, step_kwargs: dict[str, Any],
                model: Callable[[np.ndarray, float], np.ndarray] = smooth_model) -> np.ndarray:
    """Our full sampling loop over ``run`` (a run or a scheduler after set_timesteps)."""
    sample = tc.tensor(x * np.float32(run.init_noise_sigma))
    for k, t in enumerate(run.timesteps):
        model_input = run.scale_model_input(sample, t)
        output = tc.tensor(model(model_input.numpy(), float(t)))
        kwargs = dict(step_kwargs)
        if noises is not None:
            kwargs["variance_noise"] = tc.tensor(noises[k])
        sample = run.step(output, t, sample, **kwargs).prev_sample
    return sample.numpy()
