"""Helpers shared by the GPU test modules: random float64 inputs, upload, and a
comparison with float32/float16/float64 tolerances scaled to the result."""

from __future__ import annotations

import cupy as cp
import numpy as np

RNG = np.random.default_rng(0)
TOL = {np.float32: dict(rtol=2e-4, atol=2e-5), np.float64: dict(rtol=1e-9, atol=1e-11),
       np.float16: dict(rtol=2e-2, atol=2e-3)}
ACTS = ["none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"]


def rand(*shape, scale=1.0):
    return RNG.standard_normal(shape) * scale


def on_gpu(a, dtype=np.float32):
    return cp.asarray(np.asarray(a).astype(dtype))


def as_float32(a):
    """a rounded to float32 and held in float64: the exact values a float32 kernel sees,
    so a float64 reference computed from them measures only the kernel's arithmetic."""
    return None if a is None else np.asarray(a).astype(np.float32).astype(np.float64)


def check(got, want, dtype=np.float32, atol=0.0):
    """Elementwise rtol, plus an atol scaled to the result's magnitude (or ``atol``, a
    number or an array of want's shape, where larger): float32 sums with cancellation are
    only accurate to that scale."""
    got = cp.asnumpy(got).astype(np.float64)
    want = np.asarray(want, dtype=np.float64)
    tol = TOL[dtype]
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    bound = tol["rtol"] * np.abs(want) + np.maximum(max(tol["atol"], tol["rtol"] * scale), atol)
    error = np.abs(got - want)
    bad = ~(error <= bound)  # NaN fails too
    assert not bad.any(), (f"{int(bad.sum())} of {bad.size} elements off, the worst at "
                           f"{np.unravel_index(np.argmax(np.where(bad, error - bound, -np.inf)), bad.shape)}: "
                           f"got {got[bad][:4]}, want {want[bad][:4]}, bound {np.broadcast_to(bound, bad.shape)[bad][:4]}")
