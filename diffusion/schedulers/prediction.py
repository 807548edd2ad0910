"""From a model's output to the predicted clean sample x̂₀ and noise ε̂, and keeping x̂₀ in range.

A noisy sample is ``x_t = alpha * x0 + sigma * eps``; a model predicts ε
(``epsilon``), x₀ (``sample``) or v = alpha * ε - sigma * x₀ (``v_prediction``).
"""

from __future__ import annotations

from typing import Any, Mapping

import tensorcore as tc
from tensorcore import dtypes

PREDICTION_TYPES = ("epsilon", "sample", "v_prediction")


def like(coefficient: tc.Tensor, x: tc.Tensor) -> tc.Tensor:
    """A 0-d coefficient cast to ``x``'s floating dtype, so ``coefficient * x`` keeps that dtype

    (PyTorch's rule for 0-d operands, which diffusers' float32 tables rely on).
    """
    if coefficient.dtype == x.dtype or not dtypes.is_floating(x.dtype):
        return coefficient
    return coefficient.to(x.dtype)


def upcast(x: tc.Tensor) -> tc.Tensor:
    """``x`` in float32 at least (half precision upcast, float64 kept) for a solver update."""
    return x if x.dtype in (dtypes.float32, dtypes.float64) else x.to(dtypes.float32)


def predict_original(prediction_type: str, model_output: tc.Tensor, sample: tc.Tensor,
                     alpha: tc.Tensor, sigma: tc.Tensor) -> tc.Tensor:
    """x̂₀ at the noise level (alpha, sigma)."""
    if prediction_type == "epsilon":
        return (sample - sigma * model_output) / alpha
    if prediction_type == "sample":
        return model_output
    if prediction_type == "v_prediction":
        return alpha * sample - sigma * model_output
    raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")


def predict_epsilon(prediction_type: str, model_output: tc.Tensor, sample: tc.Tensor, alpha: tc.Tensor,
                    sigma: tc.Tensor, original: tc.Tensor) -> tc.Tensor:
    """ε̂ at the noise level (alpha, sigma), given the unclipped x̂₀ ``original``."""
    if prediction_type == "epsilon":
        return model_output
    if prediction_type == "sample":
        return (sample - alpha * original) / sigma
    if prediction_type == "v_prediction":
        return alpha * model_output + sigma * sample
    raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")


def bound_original(original: tc.Tensor, config: Mapping[str, Any]) -> tc.Tensor:
    """x̂₀ after dynamic thresholding (``thresholding``) or clipping (``clip_sample``)."""
    if config["thresholding"]:
        return dynamic_threshold(original, config["dynamic_thresholding_ratio"], config["sample_max_value"])
    if config.get("clip_sample", False):
        limit = config["clip_sample_range"]
        return original.clip(-limit, limit)
    return original


def dynamic_threshold(x: tc.Tensor, ratio: float, max_value: float) -> tc.Tensor:
    """Imagen's dynamic thresholding (Saharia et al. 2022): per sample, s = the ``ratio``
    quantile of |x| clamped to [1, max_value]; x is clamped to [-s, s] and divided by s."""
    dtype = x.dtype
    if dtype not in (dtypes.float32, dtypes.float64):
        x = x.to(dtypes.float32)
    flat = x.reshape(x.shape[0], -1)
    s = _row_quantile(flat.abs(), ratio).clip(1, max_value).reshape(-1, 1)
    return (tc.minimum(tc.maximum(flat, -s), s) / s).reshape(x.shape).to(dtype)


def _row_quantile(x: tc.Tensor, q: float) -> tc.Tensor:
    """The ``q`` quantile of each row (linear interpolation, as ``torch.quantile``).

    tensorcore has no sort, so this one reduction runs as the device's array module call
    (NumPy or CuPy): it stays on the device, with no copy to the host.
    """
    xp = x.backend.xp
    return tc.Tensor(xp.quantile(x.data, q, axis=1).astype(x.dtype), x.device)
