"""The loss curve as a PNG, drawn with Pillow (no plotting library needed).

The y axis is logarithmic (a diffusion loss falls by orders of magnitude early and
then creeps); the raw rows are drawn light, a running average dark.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw

from ..images import save_png

_WIDTH, _HEIGHT = 640, 400
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 28, 40


def save_loss_curve(steps: Sequence[float], losses: Sequence[float], path: str | os.PathLike,
                    title: str = "training loss") -> str:
    """Plot ``losses`` against ``steps`` into a PNG at ``path``; returns the path."""
    x, y = np.asarray(steps, np.float64), np.asarray(losses, np.float64)
    keep = np.isfinite(x) & np.isfinite(y) & (y > 0)
    x, y = x[keep], y[keep]
    image = Image.new("RGB", (_WIDTH, _HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    draw.text((_LEFT, 8), title, fill="black")
    box = (_LEFT, _TOP, _WIDTH - _RIGHT, _HEIGHT - _BOTTOM)
    draw.rectangle(box, outline="black")
    if len(x) == 0:
        draw.text((_LEFT + 8, _TOP + 8), "no finite loss values", fill="black")
        return save_png(image, path)
    x_lo, x_hi = float(x.min()), float(max(x.max(), x.min() + 1))
    lo, hi = math.floor(math.log10(y.min())), math.ceil(math.log10(y.max()))
    hi = max(hi, lo + 1)

    def to_pixel(px: np.ndarray, py: np.ndarray) -> list[tuple[float, float]]:
        u = box[0] + (px - x_lo) / (x_hi - x_lo) * (box[2] - box[0])
        v = box[3] - (np.log10(py) - lo) / (hi - lo) * (box[3] - box[1])
        return list(zip(u.tolist(), v.tolist()))

    for decade in range(lo, hi + 1):
        for mantissa in (1, 2, 5):
            value = mantissa * 10.0 ** decade
            if 10.0 ** lo <= value <= 10.0 ** hi:
                (_, v), = to_pixel(np.array([x_lo]), np.array([value]))
                draw.line((box[0], v, box[2], v), fill=(225, 225, 225) if mantissa > 1 else (190, 190, 190))
                draw.text((4, v - 6), f"{value:g}", fill="black")
    for tick in np.linspace(x_lo, x_hi, 5):
        (u, _), = to_pixel(np.array([tick]), np.array([10.0 ** lo]))
        draw.line((u, box[3], u, box[3] + 4), fill="black")
        draw.text((u - 12, box[3] + 8), f"{tick:.0f}", fill="black")
    draw.text(((box[0] + box[2]) / 2 - 12, _HEIGHT - 16), "step", fill="black")
    if len(x) > 1:
        draw.line(to_pixel(x, y), fill=(160, 190, 235), width=1)
        draw.line(to_pixel(x, _running_mean(y)), fill=(20, 60, 160), width=2)
    else:
        (u, v), = to_pixel(x, y)
        draw.ellipse((u - 3, v - 3, u + 3, v + 3), fill=(20, 60, 160))
    return save_png(image, path)


def _running_mean(y: np.ndarray) -> np.ndarray:
    """Centred moving average over about a thirtieth of the curve (no lag)."""
    half = max(1, len(y) // 60)
    sums = np.concatenate([[0.0], np.cumsum(y)])
    index = np.arange(len(y))
    lo, hi = np.maximum(index - half, 0), np.minimum(index + half + 1, len(y))
    return (sums[hi] - sums[lo]) / (hi - lo)
