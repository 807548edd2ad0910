"""One denoising step, eager or compiled: UNet, guidance, scheduler update and non-finite guard.

``denoise_step`` is one function for both paths, so a compiled pipeline computes what an
eager one does.  The UNet's conditioning comes as a dict of its keyword arguments
(``class_labels`` / ``context`` for ``UNet2D``; ``encoder_hidden_states``,
``added_cond_kwargs``, ``timestep_cond`` for ``UNet2DConditionModel``).  With
classifier-free guidance it runs the UNet once on the batch [sample, sample] with the
[uncond, cond] conditioning and combines ``uncond + (cond - uncond) * scale`` (then
rescales it by ``guidance_rescale``, as diffusers' ``rescale_noise_cfg``); the scheduler's device part
(``scheduler.step_update``) then makes the next sample and ``replace_nonfinite`` guards
it.  Compiled, the whole step is one plan -- one CUDA graph on the GPU -- and that plan
serves every step of a run: the step's numbers come in as device tensors (a row of the
run's step table, the timestep), the solver history and the guard's running count go in
and come out as tensors.  Static arguments -- the guidance scale, the step's variant (a
DPM-Solver order, whether noise is added) -- select among a few plans per run.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorcore as tc
from tensorcore import Tensor

from ..schedulers.run import StepArgs
from .guard import replace_nonfinite


def rescale_noise_cfg(guided: Tensor, cond: Tensor, rescale: float) -> Tensor:
    """The guided prediction brought back towards the conditional one's standard deviation
    (per sample), mixed by ``rescale`` (diffusers' ``rescale_noise_cfg``)."""
    axes = tuple(range(1, cond.ndim))
    rescaled = guided * (cond.std(axis=axes, keepdims=True) / guided.std(axis=axes, keepdims=True))
    return rescaled * rescale + guided * (1.0 - rescale)


def guided_prediction(unet: Any, sample: Tensor, timestep: Tensor, conditioning: dict[str, Any],
                      guidance_scale: float | None, guidance_rescale: float = 0.0) -> Tensor:
    """The noise prediction for ``sample`` at ``timestep``; guided when ``guidance_scale``
    is not None (the conditioning is then [uncond, cond], twice the sample's batch)."""
    if guidance_scale is None:
        return unet(sample, timestep, **conditioning)
    prediction = unet(tc.cat([sample, sample]), timestep, **conditioning)
    uncond, cond = prediction.chunk(2)
    guided = uncond + (cond - uncond) * guidance_scale
    return rescale_noise_cfg(guided, cond, guidance_rescale) if guidance_rescale > 0 else guided


def denoise_step(unet: Any, scheduler: Any, sample: Tensor, timestep: Tensor, values: Tensor,
                 history: tuple[Tensor, ...], total: Tensor, conditioning: dict[str, Any],
                 guidance_scale: float | None, guidance_rescale: float, variant: tuple, noise: tc.Generator | Tensor | None,
                 noise_dtype: Any, keep_original: bool) -> tuple[Tensor, ...]:
    """One step: (next sample, guard count) and, with ``keep_original``, the step's x̂₀ (a
    solver's history).  The step's ``StepArgs`` come in as their parts (``variant``,
    ``values``, ``history``, ``noise``, ``noise_dtype``), so tensors are inputs of a
    compiled call and the rest its static arguments."""
    args = StepArgs(variant, values, history, noise, noise_dtype)
    model_input = scheduler.step_input(args, sample)
    prediction = guided_prediction(unet, model_input, timestep, conditioning, guidance_scale,
                                   guidance_rescale)
    prev_sample, original = scheduler.step_update(args, prediction, sample)
    prev_sample, total = replace_nonfinite(prev_sample, total)
    return (prev_sample, total, original) if keep_original else (prev_sample, total)


def compiled_denoise_step() -> Callable[..., tuple[Tensor, ...]]:
    """``denoise_step`` as a ``tc.compile`` callable (the UNet module is an argument, so its
    structure version is part of the key; a step that cannot be traced -- dynamic
    thresholding's quantile -- runs eagerly)."""
    return tc.compile(denoise_step, fallback="eager")
