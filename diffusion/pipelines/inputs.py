"""Checking ``generate``'s arguments before any work starts.

Every check raises ``ValueError`` / ``TypeError`` naming the argument and the value,
so a bad call costs nothing and changes nothing.  What passes is gathered in a
``Request``: the arguments in the form the denoising loop uses.
"""

from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import tensorcore as tc
from tensorcore import Tensor, dtypes

from .output import OUTPUT_TYPES


@dataclass
class Request:
    """A checked ``generate`` call."""

    batch_size: int
    num_inference_steps: int
    generator: tc.Generator
    owns_generator: bool  # the generator was made for this call (from its seed)
    step_kwargs: dict[str, Any]
    guidance_scale: float
    class_labels: Tensor | None
    context: Tensor | None
    negative_context: Tensor | None
    latents: Tensor | None
    output: str
    progress: bool
    callback: Callable[[int, Any, Tensor], Any] | None
    guidance_rescale: float = 0.0

    @property
    def guided(self) -> bool:
        """Classifier-free guidance runs only above scale 1 (1 is the conditional model alone)."""
        return self.guidance_scale > 1.0


@dataclass
class ModelFacts:
    """What the checks need to know about the pipeline's models."""

    name: str
    device: str
    latent_shape: tuple[int, int, int] | None  # (C, H, W) of the sample, None when sample_size is unset
    latent_channels: int
    size_multiple: int  # latents' height and width must be multiples of it
    num_class_embeds: int | None
    null_class_label: int | None
    cross_attention_dim: int | None
    num_train_timesteps: int
    step_parameters: frozenset[str]


def step_parameters(run_step: Callable[..., Any]) -> frozenset[str]:
    """The keyword arguments a scheduler's step accepts (eta only exists for DDIM)."""
    return frozenset(inspect.signature(run_step).parameters)


def check_request(facts: ModelFacts, batch_size: Any, num_inference_steps: Any, seed: Any, generator: Any,
                  eta: Any, guidance_scale: Any, class_labels: Any, context: Any, negative_context: Any,
                  latents: Any, output: Any, progress: Any, callback: Any) -> Request:
    """The checked form of a ``generate`` call on a pipeline described by ``facts``."""
    name = facts.name
    batch = positive_int(name, "batch_size", batch_size)
    steps = checked_steps(facts, num_inference_steps)
    gen = checked_generator(name, seed, generator, facts.device)
    step_kwargs = scheduler_step_kwargs(facts, gen, eta)
    guided = finite_float(name, "guidance_scale", guidance_scale) > 1.0
    labels = _class_labels(facts, class_labels, batch, guided)
    context, negative_context = _contexts(facts, context, negative_context, batch)
    if guided and labels is None and context is None:
        raise ValueError(f"{name}: guidance_scale={guidance_scale} needs conditioning to guide by "
                         f"(class_labels or context); pass guidance_scale=1.0 for unguided sampling")
    if output not in OUTPUT_TYPES:
        raise ValueError(f"{name}: output must be one of {OUTPUT_TYPES}, got {output!r}")
    if callback is not None and not callable(callback):
        raise TypeError(f"{name}: callback must be callable(step, t, sample), got {type(callback).__name__}")
    return Request(batch, steps, gen, seed is not None, step_kwargs, float(guidance_scale), labels, context,
                   negative_context, checked_latents(facts, latents, batch), output, bool(progress), callback)


def positive_int(name: str, argument: str, value: Any) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: {argument} must be an int >= 1, got {value!r}")
    return int(value)


def finite_float(name: str, argument: str, value: Any, low: float = 0.0, high: float = math.inf) -> float:
    """``value`` as a float, checked to be a finite number in [low, high]."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value) \
            or not low <= value <= high:
        bounds = f">= {low}" if high == math.inf else f"in [{low}, {high}]"
        raise ValueError(f"{name}: {argument} must be a finite float {bounds}, got {value!r}")
    return float(value)


def checked_steps(facts: ModelFacts, num_inference_steps: Any) -> int:
    steps = positive_int(facts.name, "num_inference_steps", num_inference_steps)
    if steps > facts.num_train_timesteps:
        raise ValueError(f"{facts.name}: num_inference_steps ({steps}) cannot exceed the scheduler's "
                         f"num_train_timesteps ({facts.num_train_timesteps})")
    return steps


def scheduler_step_kwargs(facts: ModelFacts, generator: tc.Generator, eta: Any) -> dict[str, Any]:
    """The scheduler step's options: its generator and DDIM's ``eta`` (only DDIM takes one)."""
    step_kwargs: dict[str, Any] = {"generator": generator} if "generator" in facts.step_parameters else {}
    eta = finite_float(facts.name, "eta", eta)
    if "eta" in facts.step_parameters:
        step_kwargs["eta"] = eta
    elif eta != 0:
        raise ValueError(f"{facts.name}: eta={eta} needs a DDIM scheduler; this scheduler's step takes no eta")
    return step_kwargs


def checked_generator(name: str, seed: Any, generator: Any, device: str) -> tc.Generator:
    if seed is not None and generator is not None:
        raise ValueError(f"{name}: pass either seed or generator, not both")
    if generator is not None:
        if not isinstance(generator, tc.Generator):
            raise TypeError(f"{name}: generator must be a tensorcore Generator, got {type(generator).__name__}")
        if generator.device not in ("cpu", device):
            raise ValueError(f"{name}: generator is on {generator.device}, the model on {device}")
        return generator
    if seed is None:
        return tc.random.default_generator(device)
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"{name}: seed must be an int >= 0, got {seed!r}")
    return tc.Generator(device, int(seed))


def _class_labels(facts: ModelFacts, labels: Any, batch: int, guided: bool) -> Tensor | None:
    name, classes = facts.name, facts.num_class_embeds
    if labels is None:
        if classes is None:
            return None
        if facts.null_class_label is None:
            raise ValueError(f"{name}: the model is class-conditioned: pass class_labels "
                             f"(integers in [0, {classes}))")
        if guided:
            raise ValueError(f"{name}: guidance needs class_labels to guide towards")
        return tc.full((batch,), facts.null_class_label, dtype=tc.int64, device=facts.device)
    if classes is None:
        raise ValueError(f"{name}: class_labels given, but the model has no class embedding")
    if isinstance(labels, Tensor):
        if labels.device != facts.device:
            raise ValueError(f"{name}: class_labels are on {labels.device}, the model on {facts.device}")
        values = labels.numpy()
    else:
        values = np.asarray(labels)
    if values.dtype.kind not in "iu" and not (values.dtype.kind == "f" and np.all(values == np.round(values))):
        raise TypeError(f"{name}: class_labels must be integers, got {values.dtype}")
    values = np.broadcast_to(values.astype(np.int64), (batch,)) if values.ndim == 0 else values.astype(np.int64)
    if values.shape != (batch,):
        raise ValueError(f"{name}: class_labels must be one int or {batch} ints (batch_size), got shape "
                         f"{values.shape}")
    if np.any(values < 0) or np.any(values >= classes):
        raise ValueError(f"{name}: class_labels must lie in [0, {classes}), got {values.tolist()}")
    if guided and facts.null_class_label is None:
        raise ValueError(f"{name}: guidance with class_labels needs the pipeline's null_class_label "
                         f"(the label the model was trained on for 'no class')")
    return tc.tensor(np.ascontiguousarray(values), device=facts.device)


def _contexts(facts: ModelFacts, context: Any, negative_context: Any, batch: int
              ) -> tuple[Tensor | None, Tensor | None]:
    name, width = facts.name, facts.cross_attention_dim
    if context is None:
        if negative_context is not None:
            raise ValueError(f"{name}: negative_context given without context")
        if width is not None:
            raise ValueError(f"{name}: the model attends to a context: pass context [{batch}, L, {width}]")
        return None, None
    if width is None:
        raise ValueError(f"{name}: context given, but the model has no cross-attention")
    for argument, value in (("context", context), ("negative_context", negative_context)):
        if value is None:
            continue
        if not isinstance(value, Tensor):
            raise TypeError(f"{name}: {argument} must be a Tensor, got {type(value).__name__}")
        if value.ndim != 3 or value.shape[0] != batch or value.shape[2] != width:
            raise ValueError(f"{name}: {argument} must be [{batch}, L, {width}], got {value.shape}")
        if value.device != facts.device:
            raise ValueError(f"{name}: {argument} is on {value.device}, the model on {facts.device}")
    if negative_context is not None and negative_context.shape != context.shape:
        raise ValueError(f"{name}: negative_context {negative_context.shape} must match context {context.shape}")
    return context, negative_context


def checked_latents(facts: ModelFacts, latents: Any, batch: int) -> Tensor | None:
    name = facts.name
    if latents is None:
        if facts.latent_shape is None:
            raise ValueError(f"{name}: the model's config has no sample_size: pass latents "
                             f"[{batch}, {facts.latent_channels}, H, W]")
        return None
    if not isinstance(latents, Tensor):
        raise TypeError(f"{name}: latents must be a Tensor, got {type(latents).__name__}")
    channels, multiple = facts.latent_channels, facts.size_multiple
    if latents.ndim != 4 or latents.shape[:2] != (batch, channels) \
            or latents.shape[2] % multiple or latents.shape[3] % multiple:
        raise ValueError(f"{name}: latents must have shape [{batch}, {channels}, H, W] with H and W multiples "
                         f"of {multiple}, got {latents.shape}")
    if latents.device != facts.device:
        raise ValueError(f"{name}: latents are on {latents.device}, the model on {facts.device}")
    if not dtypes.is_floating(latents.dtype):
        raise TypeError(f"{name}: latents must be floating point, got {latents.dtype}")
    return latents
