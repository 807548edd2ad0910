"""ConvLSTM2d: the gate equations against a NumPy float64 loop, gradients (through every
time step) against central differences, and a moving-dot sequence it learns to predict."""

from __future__ import annotations

import numpy as np

import layers
import optim
import tensorcore as tc


def conv_same(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Direct 'same' cross-correlation of [B, C, H, W] with [O, C, k, k]."""
    k = w.shape[-1]
    pad = np.pad(x, ((0, 0), (0, 0), (k // 2, k // 2), (k // 2, k // 2)))
    out = np.zeros((x.shape[0], w.shape[0]) + x.shape[2:])
    for i in range(k):
        for j in range(k):
            out += np.einsum("bchw,oc->bohw", pad[:, :, i:i + x.shape[2], j:j + x.shape[3]], w[:, :, i, j])
    return out + b[None, :, None, None]


def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    sigmoid = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    h = np.zeros((x.shape[0], hidden) + x.shape[3:])
    c = np.zeros_like(h)
    outputs = []
    for t in range(x.shape[1]):
        gates = conv_same(np.concatenate([x[:, t], h], 1), w, b)
        i, f, o, g = np.split(gates, 4, axis=1)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        outputs.append(h)
    return np.stack(outputs, 1), c


def test_forward_matches_the_gate_equations() -> None:
    m = layers.ConvLSTM2d(2, 3, kernel_size=3).double()
    x = np.random.default_rng(0).standard_normal((2, 4, 2, 5, 6))
    outputs, (h, c) = m(tc.tensor(x))
    ref_out, ref_c = reference(x, m.conv.weight.numpy(), m.conv.bias.numpy(), 3)
    np.testing.assert_allclose(outputs.numpy(), ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h.numpy(), ref_out[:, -1], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(c.numpy(), ref_c, rtol=1e-10, atol=1e-12)
    assert outputs.shape == (2, 4, 3, 5, 6)


def test_gradients_through_time_match_central_differences() -> None:
    tc.manual_seed(1)
    m = layers.ConvLSTM2d(1, 2, kernel_size=3).double()
    rng = np.random.default_rng(1)
    x = tc.tensor(rng.standard_normal((1, 3, 1, 4, 4)), requires_grad=True)
    h0 = tc.tensor(rng.standard_normal((1, 2, 4, 4)) * 0.5, requires_grad=True)
    c0 = tc.tensor(rng.standard_normal((1, 2, 4, 4)) * 0.5, requires_grad=True)
    g_out, g_c = rng.standard_normal((1, 3, 2, 4, 4)), rng.standard_normal((1, 2, 4, 4))

    def objective() -> tc.Tensor:
        outputs, (_, c) = m(x, (h0, c0))
        return (outputs * tc.tensor(g_out)).sum() + (c * tc.tensor(g_c)).sum()
    objective().backward()
    for name, t in [("x", x), ("h0", h0), ("c0", c0), ("weight", m.conv.weight), ("bias", m.conv.bias)]:
        values, numeric = t.numpy(), np.zeros(t.shape)
        for index in np.ndindex(t.shape):
            saved = values[index]
            values[index] = saved + 1e-6
            with tc.no_grad():
                up = objective().item()
            values[index] = saved - 1e-6
            with tc.no_grad():
                down = objective().item()
            values[index] = saved
            numeric[index] = (up - down) / 2e-6
        np.testing.assert_allclose(t.grad.numpy(), numeric, rtol=1e-6, atol=1e-8, err_msg=name)


def moving_dots(count: int, steps: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """[count, steps, 1, size, size] frames of a dot moving one pixel right per step (wrapping)."""
    frames = np.zeros((count, steps, 1, size, size))
    rows, cols = rng.integers(0, size, count), rng.integers(0, size, count)
    for t in range(steps):
        frames[np.arange(count), t, 0, rows, (cols + t) % size] = 1.0
    return frames


def test_learns_to_predict_a_moving_dot() -> None:
    """Next-frame prediction: loss falls far below the all-background baseline (~0.08) and
    the brightest predicted pixel is the dot's next position in most frames."""
    tc.manual_seed(0)
    cell, head = layers.ConvLSTM2d(1, 8, kernel_size=3), layers.Conv2d(8, 1, 1)
    opt = optim.Adam(layers.ModuleList([cell, head]).parameters(), lr=0.1)
    frames = moving_dots(16, 6, 8, np.random.default_rng(0)).astype(np.float32)
    inputs, targets = tc.tensor(frames[:, :-1]), tc.tensor(frames[:, 1:])
    losses = []
    for _ in range(100):
        opt.zero_grad()
        hidden, _ = cell(inputs)
        logits = head(hidden.reshape(-1, 8, 8, 8)).reshape(targets.shape)
        loss = tc.functional.binary_cross_entropy_with_logits(logits, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < np.mean(losses[10:15]) < np.mean(losses[:5])
    assert losses[-1] < 0.03
    predicted = logits.numpy().reshape(-1, 64).argmax(1)
    assert (predicted == frames[:, 1:].reshape(-1, 64).argmax(1)).mean() >= 0.75
