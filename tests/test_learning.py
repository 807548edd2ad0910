"""Learning end to end: an MLP built from layers and trained with optim.Adam classifies the
bundled 8x8 handwritten digits (1797 images) with at least 95% held-out accuracy."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import layers
import optim
import tensorcore as tc
import tensorcore.functional as F

DIGITS = Path(__file__).resolve().parents[1] / "diffusion" / "data" / "digits.npz"


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    data = np.load(DIGITS)
    images, labels = data["images"], data["labels"]
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8 and images.max() == 16
    return images.reshape(-1, 64).astype(np.float32) / 16.0, labels.astype(np.int64)


def test_mlp_classifies_digits() -> None:
    x, y = load_digits()
    order = np.random.default_rng(0).permutation(len(x))
    train, test = order[:1437], order[1437:]
    tc.manual_seed(0)
    model = layers.Sequential(layers.Linear(64, 128), layers.ReLU(), layers.Dropout(0.1), layers.Linear(128, 10))
    opt = optim.Adam(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(1)
    first_loss = None
    for _ in range(25):
        for batch in np.array_split(rng.permutation(train), len(train) // 64):
            opt.zero_grad()
            loss = F.cross_entropy(model(tc.tensor(x[batch])), tc.tensor(y[batch]))
            loss.backward()
            opt.step()
            first_loss = first_loss if first_loss is not None else loss.item()
    model.eval()
    with tc.no_grad():
        predicted = model(tc.tensor(x[test])).argmax(axis=1).numpy()
    accuracy = (predicted == y[test]).mean()
    assert loss.item() < 0.1 * first_loss
    assert accuracy >= 0.95, f"test accuracy {accuracy:.3f}"
