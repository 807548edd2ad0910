"""The model part of one denoising step: the UNet's noise prediction, guided, eager or compiled.

``guided_prediction`` is one function for both paths, so a compiled pipeline computes
what an eager one does: with classifier-free guidance it runs the UNet once on the
batch [sample, sample] with the [uncond, cond] conditioning and combines
``uncond + (cond - uncond) * scale`` -- compiled, that is one plan (one CUDA graph)
per step.  The guidance scale is a static argument of the compiled call: one plan per
scale used.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorcore as tc
from tensorcore import Tensor


def guided_prediction(unet: Any, sample: Tensor, timestep: Tensor, class_labels: Tensor | None,
                      context: Tensor | None, guidance_scale: float | None) -> Tensor:
    """The noise prediction for ``sample`` at ``timestep``; guided when ``guidance_scale``
    is not None (the conditioning is then [uncond, cond], twice the sample's batch)."""
    if guidance_scale is None:
        return unet(sample, timestep, class_labels=class_labels, context=context)
    prediction = unet(tc.cat([sample, sample]), timestep, class_labels=class_labels, context=context)
    uncond, cond = prediction.chunk(2)
    return uncond + (cond - uncond) * guidance_scale


def compiled_prediction() -> Callable[..., Tensor]:
    """``guided_prediction`` as a ``tc.compile`` callable (the UNet module is an argument, so its
    structure version is part of the key; a model that cannot be traced runs eagerly)."""
    return tc.compile(guided_prediction, fallback="eager")
