"""The PEFT adapter settings diffusers writes into a LoRA file's header, as far as they set the scale.

diffusers saves a PEFT LoRA's ``LoraConfig`` as JSON under the header's
``lora_adapter_metadata``, each setting prefixed by its component (``unet.lora_alpha``,
``text_encoder.r``, ...).  PEFT scales a module's update by ``lora_alpha / r``, a module
an ``alpha_pattern`` entry matches using that entry's alpha instead, and by
``lora_alpha / sqrt(r)`` with ``use_rslora``.  Without these settings diffusers applies
the update in full (alpha = r).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

METADATA_KEY = "lora_adapter_metadata"
OP = "load_lora_weights"


@dataclass(frozen=True)
class PeftAlphas:
    """One component's ``lora_alpha``, ``alpha_pattern`` and ``use_rslora``."""

    lora_alpha: float
    alpha_pattern: Mapping[str, float]
    use_rslora: bool

    def alpha(self, module: str, rank: int) -> float:
        """The alpha that gives ``module`` (named as in the file) PEFT's scale as ``alpha / rank``."""
        alpha = next((value for pattern, value in self.alpha_pattern.items()
                      if re.fullmatch(rf"(.*\.)?({pattern})", module)), self.lora_alpha)
        return alpha * math.sqrt(rank) if self.use_rslora else alpha  # alpha / sqrt(r) = alpha·sqrt(r) / r


def peft_alphas(metadata: Mapping[str, Any] | None, component: str) -> PeftAlphas | None:
    """``component``'s alphas from diffusers' adapter metadata; None when it gives no ``lora_alpha``."""
    if metadata is None or f"{component}.lora_alpha" not in metadata:
        return None
    settings = {key.removeprefix(f"{component}."): value for key, value in metadata.items()
                if key.startswith(f"{component}.")}
    if settings.get("use_dora"):
        raise ValueError(f"{OP}: the {component}'s adapter is a DoRA (use_dora), which is not supported")
    pattern = settings.get("alpha_pattern") or {}
    if not isinstance(pattern, dict) or not all(isinstance(k, str) and _is_number(v) for k, v in pattern.items()):
        raise ValueError(f"{OP}: {component}.alpha_pattern in the file's metadata must map module patterns to "
                         f"numbers, got {pattern!r}")
    for key in pattern:
        try:
            re.compile(key)
        except re.error as exc:
            raise ValueError(f"{OP}: {component}.alpha_pattern key {key!r} is not a valid pattern ({exc})") from exc
    alpha, rslora = settings["lora_alpha"], settings.get("use_rslora", False)
    if not _is_number(alpha) or not isinstance(rslora, bool):
        raise ValueError(f"{OP}: {component}.lora_alpha must be a number and {component}.use_rslora a bool in the "
                         f"file's metadata, got {alpha!r} and {rslora!r}")
    return PeftAlphas(float(alpha), {k: float(v) for k, v in pattern.items()}, rslora)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
