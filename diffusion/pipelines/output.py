"""What ``generate`` returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OUTPUT_TYPES = ("tensor", "numpy", "pil")


@dataclass
class ImagePipelineOutput:
    """``images``: a Tensor ``[B, C, H, W]`` in [0, 1] on the model's device (``output="tensor"``),
    a float32 NumPy array ``[B, H, W, C]`` in [0, 1] (``"numpy"``) or a list of Pillow images
    (``"pil"``).  ``nonfinite_count``: how many NaN/Inf values the non-finite guard replaced
    during the generation (0 when all was well; a warning is issued otherwise).
    ``steps_run``: the denoising steps taken (fewer than asked when a callback stopped the loop)."""

    images: Any
    nonfinite_count: int = 0
    steps_run: int = 0
