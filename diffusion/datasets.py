"""The bundled 8x8 handwritten digits (UCI optdigits, 1797 images), so nothing is downloaded."""

from __future__ import annotations

from importlib import resources

import numpy as np

NUM_DIGIT_CLASSES = 10


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """Images as float32 in [0, 1], shape [1797, 8, 8], and int64 labels [1797]."""
    with resources.files("diffusion").joinpath("data/digits.npz").open("rb") as f:
        data = np.load(f)
        images, labels = data["images"], data["labels"]
    return images.astype(np.float32) / 16.0, labels.astype(np.int64)


def train_test_split(n: int, test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled index arrays (train, test) for n samples."""
    order = np.random.default_rng(seed).permutation(n)
    n_test = int(round(n * test_fraction))
    return order[n_test:], order[:n_test]


def digit_images(size: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """The digits as diffusion training data: float32 images ``[1797, 1, size, size]``
    scaled to [-1, 1] (bilinearly resized when ``size`` is not 8), and int64 labels."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"digit_images: size must be a positive int, got {size!r}")
    images, labels = load_digits()
    if size != images.shape[-1]:
        rows = _bilinear_weights(images.shape[-2], size)
        cols = _bilinear_weights(images.shape[-1], size)
        images = np.einsum("oh,nhw,pw->nop", rows, images, cols).astype(np.float32)
    return (images[:, None] * 2.0 - 1.0).astype(np.float32), labels


def _bilinear_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] linear-interpolation matrix with half-pixel centres
    (``align_corners=False``, as ``torch.nn.functional.interpolate`` does)."""
    centres = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
    low = np.floor(centres).astype(np.int64)
    high = np.minimum(low + 1, n_in - 1)
    frac = centres - low
    weights = np.zeros((n_out, n_in), np.float64)
    weights[np.arange(n_out), low] += 1 - frac
    weights[np.arange(n_out), high] += frac
    return weights
