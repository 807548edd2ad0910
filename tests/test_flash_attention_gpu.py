"""Flash attention (``backends/cupy/flash_attention.py``) against attention in float64.

Inputs come as the UNet's attention makes them: views of a projection's [B, L, H·d]
output (strided heads), or contiguous [B, H, L, d].  Bounds are on max |error| of outputs
whose values are averages of v ~ N(0, 1): float16 rounds P to 11 bits before P·V, bfloat16
to 8.  The op path is checked too: ``scaled_dot_product_attention`` without gradients
takes the kernel, with gradients the path that keeps the probabilities; and a CUDA graph
replay equals the eager call.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

import tensorcore as tc  # noqa: E402
import tensorcore.functional as F  # noqa: E402
from tensorcore.backends.cupy import flash_attention  # noqa: E402

BOUNDS = {"float16": 4e-3, "bfloat16": 3e-2}
DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, scale: float) -> np.ndarray:
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scores = q @ k.swapaxes(-1, -2) * scale
    if causal:
        lq, lk = scores.shape[-2:]
        scores = np.where(np.arange(lk)[None, :] > np.arange(lq)[:, None], -np.inf, scores)
    scores -= scores.max(-1, keepdims=True)
    p = np.exp(scores)
    return (p / p.sum(-1, keepdims=True)) @ v


def heads(rng: np.random.Generator, b: int, h: int, length: int, d: int, dtype: str, strided: bool):
    """(host values [B, H, L, d], the device array): strided = a view of [B, L, H·d]."""
    values = rng.standard_normal((b, length, h, d)).astype(DTYPES[dtype])
    device = tc.tensor(values, device="cuda").data.transpose(0, 2, 1, 3)
    host = values.transpose(0, 2, 1, 3)
    return (host, device) if strided else (np.ascontiguousarray(host), cp.ascontiguousarray(device))


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 3), d=st.sampled_from([40, 64, 80, 128, 160]),
       lq=st.sampled_from([1, 17, 64, 77, 130, 257]), lk=st.sampled_from([1, 8, 63, 77, 129, 300]),
       causal=st.booleans(), strided=st.booleans(), dtype=st.sampled_from(list(BOUNDS)), seed=st.integers(0, 99))
def test_flash_attention_matches_float64(b, h, d, lq, lk, causal, strided, dtype, seed) -> None:
    rng = np.random.default_rng(seed)
    (q, qd), (k, kd), (v, vd) = (heads(rng, b, h, n, d, dtype, strided) for n in (lq, lk, lk))
    assert flash_attention.fits(qd, kd, vd)
    scale = 1 / math.sqrt(d)
    out = flash_attention.forward(qd, kd, vd, causal, scale)
    assert out.transpose(0, 2, 1, 3).flags.c_contiguous  # heads merge back without a copy
    got = tc.Tensor(out, "cuda").numpy().astype(np.float64)
    want = reference(q, k, v, causal, scale)
    if causal and lk < lq:  # rows that see no key: the reference's 0/0
        want = np.nan_to_num(want)
        got[..., lk:, :] = 0.0
        want[..., lk:, :] = 0.0
    assert np.abs(got - want).max() <= BOUNDS[dtype]


def test_unsupported_layouts_and_dtypes_are_refused() -> None:
    x = cp.zeros((1, 2, 16, 40), dtype=cp.float16)
    assert not flash_attention.fits(x.astype(cp.float32), x.astype(cp.float32), x.astype(cp.float32))
    assert not flash_attention.fits(x[..., :36], x[..., :36], x[..., :36])  # head dim not a multiple of 8
    assert not flash_attention.fits(x, x, cp.zeros((1, 2, 16, 64), dtype=cp.float16))  # v wider than q
    shifted = cp.zeros(x.size + 1, dtype=cp.float16)[1:].reshape(x.shape)
    assert not flash_attention.fits(shifted, x, x)  # a base off 16 bytes


@pytest.mark.parametrize("dtype", [tc.float16, tc.bfloat16])
def test_the_op_takes_flash_attention_without_gradients_and_graphs_replay_it(dtype, monkeypatch) -> None:
    calls = []
    real = flash_attention.forward
    monkeypatch.setattr(flash_attention, "forward", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(0)
    q, k, v = (tc.tensor(rng.standard_normal((2, 8, 256, 40)).astype(np.float32), device="cuda").to(dtype=dtype)
               for _ in range(3))
    with tc.no_grad():
        eager = F.scaled_dot_product_attention(q, k, v)
    assert calls == [1]
    want = reference(*(t.to(dtype=tc.float32).numpy() for t in (q, k, v)), False, 40 ** -0.5)
    assert np.abs(eager.to(dtype=tc.float32).numpy() - want).max() <= BOUNDS[str(dtype).split(".")[-1]]
    compiled = tc.compile(lambda a, b, c: F.scaled_dot_product_attention(a, b, c))
    with tc.no_grad():
        for _ in range(3):
            replayed = compiled(q, k, v)
    assert compiled.cache_info().hits >= 1
    np.testing.assert_array_equal(replayed.to(dtype=tc.float32).numpy(), eager.to(dtype=tc.float32).numpy())
    before = len(calls)
    q.requires_grad_(True)
    F.scaled_dot_product_attention(q, k, v).sum().backward()  # the training path keeps the probabilities
    assert len(calls) == before and q.grad is not None
