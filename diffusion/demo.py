"""A first run of the engine: an MLP classifier on the bundled digits, trained with plain SGD.

Everything is written with tensorcore ops (no layers, no optim) so the demo shows the
engine itself: tensors, autograd and a backend doing the work.
"""

from __future__ import annotations

import math
import time

import tensorcore as tc
import tensorcore.functional as F

from .datasets import load_digits, train_test_split


def run_demo(steps: int = 300, batch: int = 128, lr: float = 0.1, hidden: int = 128, seed: int = 0) -> float:
    """Train, print the loss as it falls, and return the test accuracy."""
    tc.manual_seed(seed)
    images, labels = load_digits()
    x_all, y_all = tc.tensor(images.reshape(len(images), -1)), tc.tensor(labels)
    train_idx, test_idx = train_test_split(len(images), seed=seed)
    w1 = (tc.randn(64, hidden) * math.sqrt(2 / 64)).requires_grad_()
    b1 = tc.zeros(hidden, requires_grad=True)
    w2 = (tc.randn(hidden, 10) * math.sqrt(1 / hidden)).requires_grad_()
    b2 = tc.zeros(10, requires_grad=True)
    params = [w1, b1, w2, b2]
    rng = tc.Generator(seed=seed)
    start = time.perf_counter()
    print(f"backend={tc.get_backend().name}  training a 64-{hidden}-10 MLP on {len(train_idx)} digits")
    for step in range(1, steps + 1):
        pick = tc.tensor(train_idx)[tc.randint(0, len(train_idx), (batch,), generator=rng)]
        logits = F.relu(x_all[pick] @ w1 + b1) @ w2 + b2
        loss = F.cross_entropy(logits, y_all[pick])
        loss.backward()
        with tc.no_grad():
            for p in params:
                p -= lr * p.grad
                p.grad = None
        if step == 1 or step % 50 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    with tc.no_grad():
        test = tc.tensor(test_idx)
        predicted = (F.relu(x_all[test] @ w1 + b1) @ w2 + b2).argmax(axis=1)
        accuracy = (predicted == y_all[test]).float().mean().item()
    print(f"test accuracy {accuracy:.3f}  ({time.perf_counter() - start:.1f} s)")
    return accuracy
