"""Images into image-to-image pipelines, as diffusers' ``VaeImageProcessor.preprocess`` takes them.

Accepted: a Pillow image or a list of them (converted to RGB; sizes cut down to a
multiple of the VAE's scale with a Lanczos resize), a NumPy array [H, W, C] / [B, H, W, C]
in [0, 1], or a Tensor [C, H, W] / [B, C, H, W] in [0, 1].  Values are mapped to [-1, 1];
a Tensor that already has negative values is taken to be in [-1, 1], as diffusers does.
A Tensor with the VAE's latent channels is taken as latents and used as they are.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from PIL import Image

import tensorcore as tc
from tensorcore import Tensor


def image_input(image: Any, scale: int, latent_channels: int, device: str, dtype: Any,
                owner: str) -> tuple[Tensor, bool]:
    """(the image batch [B, 3, H, W] in [-1, 1] or latents [B, C, h, w], whether they are latents)."""
    images = image if isinstance(image, list) else [image]
    if not images:
        raise ValueError(f"{owner}: image is an empty list")
    if all(isinstance(i, Image.Image) for i in images):
        return _to_device(_from_pil(images, scale), device, dtype), False
    if isinstance(image, np.ndarray):
        array = image[None] if image.ndim == 3 else image
        if array.ndim != 4 or array.shape[-1] != 3:
            raise ValueError(f"{owner}: a NumPy image must be [H, W, 3] or [B, H, W, 3], got shape {image.shape}")
        return _to_device(_normalized(array.transpose(0, 3, 1, 2).astype(np.float32), owner), device, dtype, scale,
                          owner), False
    if isinstance(image, Tensor):
        batch = image.unsqueeze(0) if image.ndim == 3 else image
        if batch.ndim != 4:
            raise ValueError(f"{owner}: a Tensor image must be [C, H, W] or [B, C, H, W], got shape {image.shape}")
        if batch.shape[1] == latent_channels:
            return batch.to(device, dtype=dtype), True
        if batch.shape[1] != 3:
            raise ValueError(f"{owner}: a Tensor image needs 3 channels (or {latent_channels} for latents), "
                             f"got shape {image.shape}")
        return _to_device(_normalized(batch.to(device, dtype=tc.float32), owner), device, dtype, scale,
                          owner), False
    raise TypeError(f"{owner}: image must be a PIL image (or a list of them), a NumPy array or a Tensor, "
                    f"got {type(image).__name__}")


def _from_pil(images: list[Image.Image], scale: int) -> np.ndarray:
    """RGB images, each cut down to a multiple of ``scale`` (Lanczos) -> [B, 3, H, W] in [-1, 1]."""
    width, height = (x - x % scale for x in images[0].size)
    arrays = []
    for image in images:
        if image.size != (width, height):
            image = image.resize((width, height), resample=Image.LANCZOS)
        arrays.append(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0)
    return np.stack(arrays).transpose(0, 3, 1, 2) * 2.0 - 1.0


def _normalized(values: Any, owner: str) -> Any:
    """[0, 1] values to [-1, 1]; values with negatives are taken to be in [-1, 1] already."""
    low = float(values.min())
    if low < 0:
        warnings.warn(f"{owner}: the image has negative values, so it is taken to be in [-1, 1] already",
                      UserWarning, stacklevel=4)
        return values
    return values * 2.0 - 1.0


def _to_device(values: Any, device: str, dtype: Any, scale: int | None = None, owner: str = "") -> Tensor:
    """``values`` as a Tensor on ``device`` in ``dtype``; sizes must be multiples of ``scale`` when given."""
    tensor = values if isinstance(values, Tensor) else tc.tensor(np.ascontiguousarray(values, dtype=np.float32))
    if scale is not None and (tensor.shape[2] % scale or tensor.shape[3] % scale):
        raise ValueError(f"{owner}: the image's height and width must be multiples of {scale}, got "
                         f"{tensor.shape[2]}x{tensor.shape[3]}")
    return tensor.to(device, dtype=dtype)
