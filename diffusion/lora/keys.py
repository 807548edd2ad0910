"""LoRA state dicts in the formats diffusers and kohya write, turned into one canonical form.

A LoRA file gives, for every layer it adapts, a down factor, an up factor and optionally
an alpha, under keys of one of two forms:

* diffusers / PEFT: ``unet.<module>.lora_A.weight`` / ``.lora_B.weight`` (older files:
  ``.lora.down.weight`` / ``.lora.up.weight``, ``.lora_linear_layer.down.weight`` /
  ``.up.weight``) and ``<module>.alpha``, for ``unet``, ``text_encoder`` and
  ``text_encoder_2``;
* kohya: ``lora_unet_<module>.lora_down.weight`` / ``.lora_up.weight`` / ``.alpha`` with
  the module's dots written as underscores; ``lora_te_`` (or ``lora_te1_``) for the text
  encoder, ``lora_te2_`` for the second one.  These names are resolved against the
  model's own layer names, never guessed.

``canonical_weights`` returns ``{component: {module name: LoraWeights}}`` with our models'
dotted module names.  Every key is accounted for and every factor checked against the
layer it adapts before anything is returned, so a bad file changes no model.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from layers import Module

from .adapters import adapter_class
from .metadata import OP, PeftAlphas, peft_alphas
from .weights import LoraWeights

COMPONENTS = ("unet", "text_encoder", "text_encoder_2")
KOHYA_PREFIXES = {"lora_unet_": "unet", "lora_te_": "text_encoder", "lora_te1_": "text_encoder",
                  "lora_te2_": "text_encoder_2"}
PARTS = {".lora_A.weight": "down", ".lora_B.weight": "up",
         ".lora.down.weight": "down", ".lora.up.weight": "up",
         ".lora_linear_layer.down.weight": "down", ".lora_linear_layer.up.weight": "up",
         ".lora_down.weight": "down", ".lora_up.weight": "up",
         ".alpha": "alpha"}


def canonical_weights(state_dict: Mapping[str, np.ndarray], models: Mapping[str, Module],
                      metadata: Mapping[str, Any] | None = None) -> dict[str, dict[str, LoraWeights]]:
    """``{component: {module name: LoraWeights}}`` for a LoRA state dict and the models it adapts
    (``models`` maps the components present to their modules); ``metadata`` is diffusers'
    adapter metadata, which gives the alphas of a PEFT LoRA saved without ``.alpha`` keys."""
    layers = {component: _Layers(component, model) for component, model in models.items()}
    alphas = {component: peft_alphas(metadata, component) for component in models}
    # (component, module) -> (the module's name in the file, part -> (key, array))
    grouped: dict[tuple[str, str], tuple[str, dict[str, tuple[str, np.ndarray]]]] = {}
    for key, array in state_dict.items():
        component, written, part, kohya = split_key(key)
        if component not in layers:
            raise ValueError(f"{OP}: {key!r} adapts the {component}, which this pipeline does not have")
        module = layers[component].resolve(written, kohya, key)
        _, parts = grouped.setdefault((component, module), (written, {}))
        if part in parts:
            raise ValueError(f"{OP}: {key!r} and {parts[part][0]!r} both give the {part} of {module!r}")
        parts[part] = (key, array)
    found: dict[str, dict[str, LoraWeights]] = {}
    for (component, module), (written, parts) in grouped.items():
        layer = layers[component].modules[module]
        found.setdefault(component, {})[module] = _weights(parts, layer, module, written, alphas[component])
    return found


def split_key(key: str) -> tuple[str, str, str, bool]:
    """(component, module name as the key writes it, "down" | "up" | "alpha", whether kohya's form)."""
    suffix = next((s for s in PARTS if key.endswith(s)), None)
    if suffix is None:
        raise ValueError(f"{OP}: {key!r} is not a LoRA key (a module name followed by one of {', '.join(PARTS)})")
    head, part = key[: -len(suffix)], PARTS[suffix]
    prefix = next((p for p in KOHYA_PREFIXES if head.startswith(p)), None)
    if prefix is not None:
        return KOHYA_PREFIXES[prefix], head[len(prefix):], part, True
    component, _, module = head.partition(".")
    if component not in COMPONENTS or not module:
        raise ValueError(f"{OP}: {key!r} names no component; keys start with {', '.join(c + '.' for c in COMPONENTS)} "
                         f"(diffusers) or {', '.join(KOHYA_PREFIXES)} (kohya)")
    return component, module, part, False


class _Layers:
    """The layers of one model LoRA can adapt, by name and by kohya's flattened name."""

    def __init__(self, component: str, model: Module) -> None:
        self.component, self.model = component, model
        self.modules = {name: m for name, m in model.named_modules() if adapter_class(m) is not None}
        self.flat: dict[str, list[str]] = {}
        for name in self.modules:
            self.flat.setdefault(name.replace(".", "_"), []).append(name)

    def resolve(self, written: str, kohya: bool, key: str) -> str:
        """Our name of the module ``key`` writes as ``written``."""
        if kohya:
            names = self.flat.get(written, [])
            if len(names) > 1:
                raise ValueError(f"{OP}: {key!r} could name any of {names} in the {self.component}")
            name = names[0] if names else written
        else:
            name = written if written in self.modules else self._checkpoint_name(written)
        if name not in self.modules:
            raise ValueError(f"{OP}: {key!r} names {written!r}, which is no Linear or ungrouped Conv2d of the "
                             f"{self.component} ({type(self.model).__name__})")
        return name

    def _checkpoint_name(self, written: str) -> str:
        """``written`` renamed as the model renames checkpoint keys (``checkpoint_weights``: e.g.
        transformers 5 writes CLIP text models without their ``text_model.`` prefix)."""
        rename = getattr(self.model, "checkpoint_weights", None)
        renamed = list(rename({f"{written}.weight": None})) if rename is not None else []
        return renamed[0].removesuffix(".weight") if len(renamed) == 1 else written


def _weights(parts: dict[str, tuple[str, np.ndarray]], layer: Module, module: str, written: str,
             alphas: PeftAlphas | None) -> LoraWeights:
    """The checked factors and alpha of ``module`` (``written`` in the file) from its keys."""
    missing = [part for part in ("down", "up") if part not in parts]
    if missing:
        some = next(iter(parts.values()))[0]
        raise ValueError(f"{OP}: {some!r} comes without the {' and '.join(missing)} factor of {module!r}")
    (down_key, down), (up_key, up) = parts["down"], parts["up"]
    if down.ndim not in (2, 4) or down.shape[0] < 1:
        raise ValueError(f"{OP}: {down_key!r} has shape {down.shape}; a down factor is [rank, in] or "
                         "[rank, in, kh, kw] with rank >= 1")
    rank = down.shape[0]
    down_shape, up_shape = adapter_class(layer).factor_shapes(layer, rank)
    down = _fitted(down, down_shape, down_key, layer, module)
    up = _fitted(up, up_shape, up_key, layer, module)
    if "alpha" in parts:
        alpha = _alpha(*parts["alpha"])
    else:
        alpha = alphas.alpha(written, rank) if alphas is not None else None
    return LoraWeights(down, up, alpha, down_key)


def _fitted(array: np.ndarray, shape: tuple[int, ...], key: str, layer: Module, module: str) -> np.ndarray:
    """``array`` as ``shape``, when it is that shape or differs only by 1×1 kernel axes (a Linear
    adapted as a 1×1 convolution, or the other way round)."""
    if array.shape == shape:
        return array
    if array.shape[:2] == shape[:2] and all(n == 1 for n in array.shape[2:] + shape[2:]):
        return array.reshape(shape)
    raise ValueError(f"{OP}: {key!r} has shape {array.shape}, but {module!r} "
                     f"({type(layer).__name__}({layer.extra_repr()})) takes {shape} there")


def _alpha(key: str, value: np.ndarray) -> float:
    try:
        alpha = float(np.asarray(value).astype(np.float64).reshape(-1)[0]) if np.size(value) == 1 else math.nan
    except (TypeError, ValueError):
        alpha = math.nan
    if not math.isfinite(alpha):
        raise ValueError(f"{OP}: {key!r} must hold one finite number, got {value!r}")
    return alpha
