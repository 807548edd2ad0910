"""The bundled 8x8 handwritten digits (UCI optdigits, 1797 images), so nothing is downloaded."""

from __future__ import annotations

from importlib import resources

import numpy as np


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
