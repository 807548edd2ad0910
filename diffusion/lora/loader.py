"""``LoraLoaderMixin``: diffusers' LoRA methods for a pipeline.

A pipeline holding ``unet``, ``text_encoder`` and optionally ``text_encoder_2`` (plain
modules or ``tc.compile`` wrappers of them) inherits these methods:

    pipe.load_lora_weights("folder_or_file.safetensors", adapter_name="style")
    pipe.set_adapters(["style", "pixel"], adapter_weights=[0.5, 1.2])
    pipe.fuse_lora(lora_scale=0.8)      # into the weights; unfuse_lora() takes it out
    pipe.unload_lora_weights()          # the plain layers and weights again

The layers an adapter touches become ``LoraLinear`` / ``LoraConv2d`` (same parameters and
state_dict); the pipeline keeps which adapters exist, their weights, the active ones and
the LoRA scale (``set_lora_scale``, what ``cross_attention_kwargs={"scale": s}`` sets).
Every change bumps the affected model's structure version, so compiled plans retrace.
Methods check their arguments before changing anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from layers import Module

from ..pipelines.modules import unwrapped
from .adapters import LoraLayer, adapter_class
from .keys import COMPONENTS, canonical_weights
from .source import Source, read_lora


@dataclass
class _Adapters:
    """A pipeline's LoRA bookkeeping: each loaded adapter (in load order) with the components
    it adapts and its weight, the active adapters, and the LoRA scale."""

    components: dict[str, tuple[str, ...]] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    active: list[str] = field(default_factory=list)
    scale: float = 1.0


class LoraLoaderMixin:
    """LoRA adapters (diffusers/PEFT and kohya files) for the pipeline's UNet and text encoders."""

    # ----- loading -------------------------------------------------------------------------
    def load_lora_weights(self, pretrained_model_name_or_path_or_dict: Source, adapter_name: str | None = None,
                          weight_name: str | None = None) -> None:
        """Load a LoRA as the adapter ``adapter_name`` (default ``default_<n>``) and make it the
        only active one.  The source is a ``.safetensors`` file, a folder holding
        ``weight_name`` (default ``pytorch_lora_weights.safetensors``) or a dict of arrays."""
        state = self._lora_adapters()
        self._refuse_when_fused("load_lora_weights")
        name = self._new_adapter_name(adapter_name, state)
        arrays, metadata = read_lora(pretrained_model_name_or_path_or_dict, weight_name)
        models = self._lora_models()
        found = canonical_weights(arrays, models, metadata)
        if not found:
            raise ValueError("load_lora_weights: the LoRA holds no weights")
        for component, modules in found.items():
            model = models[component]
            for path, weights in modules.items():
                layer = _module(model, path)
                if not isinstance(layer, LoraLayer):
                    layer = adapter_class(layer)(layer)
                    _replace(model, path, layer)
                layer.add_adapter(name, weights)
        state.components[name] = tuple(found)
        state.weights[name] = 1.0
        state.active = [name]
        self._apply_active()

    def unload_lora_weights(self) -> None:
        """Remove every adapter: the plain layers come back with their original weights."""
        for model in self._lora_models().values():
            for path, layer in _lora_layers(model):
                _replace(model, path, layer.plain())
        vars(self).pop("_lora", None)

    # ----- choosing adapters ---------------------------------------------------------------
    def set_adapters(self, adapter_names: str | Sequence[str],
                     adapter_weights: float | Sequence[float | None] | None = None) -> None:
        """Make ``adapter_names`` the active adapters, with ``adapter_weights`` (one number for
        all, one per adapter, None for 1.0)."""
        state = self._lora_adapters()
        names = _names("set_adapters", adapter_names, state)
        if adapter_weights is None or not isinstance(adapter_weights, Sequence):
            adapter_weights = [adapter_weights] * len(names)
        if len(adapter_weights) != len(names):
            raise ValueError(f"set_adapters: {len(names)} adapter names but {len(adapter_weights)} weights")
        weights = [1.0 if w is None else _number("set_adapters", "adapter weight", w) for w in adapter_weights]
        self._refuse_when_fused("set_adapters")
        state.weights.update(zip(names, weights))
        state.active = names
        self._apply_active()

    def get_active_adapters(self) -> list[str]:
        return list(self._lora_adapters().active)

    def get_list_adapters(self) -> dict[str, list[str]]:
        """The adapters each component holds, in load order (components without any left out)."""
        state = self._lora_adapters()
        listed = {c: [name for name, held in state.components.items() if c in held] for c in COMPONENTS}
        return {component: names for component, names in listed.items() if names}

    def delete_adapters(self, adapter_names: str | Sequence[str]) -> None:
        """Remove adapters; a layer left without any becomes the plain layer again.  When no
        active adapter remains, the first remaining one becomes active (as PEFT does)."""
        state = self._lora_adapters()
        names = _names("delete_adapters", adapter_names, state)
        self._refuse_when_fused("delete_adapters")
        for model in self._lora_models().values():
            for path, layer in _lora_layers(model):
                for name in set(names) & set(layer.adapter_names):
                    layer.delete_adapter(name)
                if not layer.adapter_names:
                    _replace(model, path, layer.plain())
        for name in names:
            del state.components[name], state.weights[name]
        state.active = [name for name in state.active if name not in names] or list(state.weights)[:1]
        self._apply_active()

    def set_lora_scale(self, scale: float) -> None:
        """Scale every active adapter by ``scale`` (diffusers' ``cross_attention_kwargs={"scale": s}``);
        nothing changes when ``scale`` is the current one."""
        state = self._lora_adapters()
        scale = _number("set_lora_scale", "scale", scale)
        if scale != state.scale:
            state.scale = scale
            self._apply_active()

    # ----- fusing --------------------------------------------------------------------------
    def fuse_lora(self, lora_scale: float = 1.0, adapter_names: Sequence[str] | None = None) -> None:
        """Add ``lora_scale`` × weight × alpha / rank × up @ down of the adapters (default: the
        active ones) into the base weights of every adapted layer; the forward is then the base
        alone.  ``unfuse_lora`` restores the weights exactly."""
        state = self._lora_adapters()
        names = state.active if adapter_names is None else _names("fuse_lora", adapter_names, state)
        lora_scale = _number("fuse_lora", "lora_scale", lora_scale)
        self._refuse_when_fused("fuse_lora")
        weights = {name: state.weights[name] * lora_scale for name in names}
        for layer in self._all_lora_layers():
            layer.fuse(weights)

    def unfuse_lora(self) -> None:
        """Restore the weights ``fuse_lora`` changed, bit for bit (nothing happens when none are fused)."""
        for layer in self._all_lora_layers():
            layer.unfuse()

    # ----- helpers -------------------------------------------------------------------------
    def _lora_adapters(self) -> _Adapters:
        return vars(self).setdefault("_lora", _Adapters())

    def _lora_models(self) -> dict[str, Module]:
        """The pipeline's components LoRA can adapt, unwrapped from ``tc.compile``."""
        models = {component: getattr(self, component, None) for component in COMPONENTS}
        return {component: unwrapped(model) for component, model in models.items() if model is not None}

    def _all_lora_layers(self) -> Iterator[LoraLayer]:
        for model in self._lora_models().values():
            for _, layer in _lora_layers(model):
                yield layer

    def _apply_active(self) -> None:
        """Give every adapted layer the active adapters' weights times the LoRA scale."""
        state = self._lora_adapters()
        weights = {name: state.weights[name] * state.scale for name in state.active}
        for layer in self._all_lora_layers():
            layer.set_active(weights)

    def _refuse_when_fused(self, op: str) -> None:
        if any(layer.fused for layer in self._all_lora_layers()):
            raise ValueError(f"{op}: the LoRA weights are fused into the model; call unfuse_lora() first")

    def _new_adapter_name(self, name: str | None, state: _Adapters) -> str:
        if name is None:
            number = len(state.weights)
            while f"default_{number}" in state.weights:
                number += 1
            return f"default_{number}"
        if not isinstance(name, str):
            raise TypeError(f"load_lora_weights: adapter_name must be a str, got {type(name).__name__}")
        if not name or "." in name:
            raise ValueError(f"load_lora_weights: adapter_name must be non-empty and without '.', got {name!r}")
        if name in state.weights:
            raise ValueError(f"load_lora_weights: an adapter named {name!r} is already loaded; "
                             "choose another adapter_name or delete_adapters() it first")
        return name


def _names(op: str, names: str | Sequence[str], state: _Adapters) -> list[str]:
    """``names`` as a list, each one a loaded adapter."""
    names = [names] if isinstance(names, str) else list(names)
    unknown = [name for name in names if name not in state.weights]
    if unknown:
        raise ValueError(f"{op}: no adapter named {', '.join(map(repr, unknown))}; loaded: {list(state.weights)}")
    return names


def _number(op: str, what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{op}: {what} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{op}: {what} must be finite, got {value!r}")
    return float(value)


def _lora_layers(model: Module) -> list[tuple[str, LoraLayer]]:
    """(dotted name, layer) of every adapted layer of ``model``, listed before any is replaced."""
    return [(name, module) for name, module in model.named_modules() if isinstance(module, LoraLayer)]


def _module(model: Module, path: str) -> Module:
    for name in path.split("."):
        model = model._modules[name]
    return model


def _replace(model: Module, path: str, layer: Module) -> None:
    """Put ``layer`` where ``path`` names a module of ``model`` (its parent's structure version changes)."""
    parent, _, name = path.rpartition(".")
    setattr(_module(model, parent) if parent else model, name, layer)
