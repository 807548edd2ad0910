"""The Numba backend's short-sequence attention kernel (``numba/attention.py``).

Against the NumPy reference in float64 over batches, heads, lengths, head widths,
masks and causal masking, with the heads as strided views of a projection (as the
attention layer passes them); gradients by central differences through
``scaled_dot_product_attention``; the output and gradients in [B, L, H, D] memory;
long sequences left to the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("numba")

import tensorcore as tc  # noqa: E402
import tensorcore.functional as F  # noqa: E402
from tensorcore.backends.numba import attention as numba_attention  # noqa: E402
from tensorcore.backends.numba.backend import NumbaBackend  # noqa: E402
from tensorcore.backends.numpy.backend import NumpyBackend  # noqa: E402

NB, NP = NumbaBackend(), NumpyBackend()


def heads(rng, b: int, h: int, length: int, d: int, dtype) -> np.ndarray:
    """[B, H, L, D], a permuted view of [B, L, H, D] memory (a projection split into heads)."""
    return rng.standard_normal((b, length, h, d)).astype(dtype).transpose(0, 2, 1, 3)


@settings(max_examples=40)
@given(b=st.integers(1, 3), h=st.integers(1, 3), lq=st.integers(1, 20), lk=st.integers(1, 20),
       d=st.integers(1, 40), dv=st.integers(1, 40), masked=st.booleans(), causal=st.booleans(),
       dtype=st.sampled_from([np.float64, np.float32]), seed=st.integers(0, 2**16))
def test_forward_and_backward_match_the_reference(b, h, lq, lk, d, dv, masked, causal, dtype, seed):
    rng = np.random.default_rng(seed)
    q, k, v = heads(rng, b, h, lq, d, dtype), heads(rng, b, h, lk, d, dtype), heads(rng, b, h, lk, dv, dtype)
    mask = rng.standard_normal((1, h, lq, lk)).astype(dtype) if masked else None
    causal = causal and not masked and lk >= lq  # every row keeps a key
    out, probs = NB.attention(q, k, v, mask, causal, 0.3)
    want, want_probs = NP.attention(q, k, v, mask, causal, 0.3)
    grad = rng.standard_normal(out.shape).astype(dtype)
    got_grads = NB.attention_backward(grad, q, k, v, probs, 0.3)
    want_grads = NP.attention_backward(grad, q, k, v, want_probs, 0.3)
    bound = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    for got, ref in [(out, want), (probs, want_probs), *zip(got_grads, want_grads)]:
        assert got.shape == ref.shape and got.dtype == dtype
        np.testing.assert_allclose(got, ref, **bound)


def test_results_lie_heads_last_so_merging_heads_copies_nothing():
    rng = np.random.default_rng(0)
    q = heads(rng, 2, 3, 5, 4, np.float32)
    out, probs = NB.attention(q, q, q, None, False, 0.5)
    assert out.transpose(0, 2, 1, 3).flags.c_contiguous and probs.flags.c_contiguous
    for g in NB.attention_backward(np.ones_like(out), q, q, q, probs, 0.5):
        assert g.transpose(0, 2, 1, 3).flags.c_contiguous


def test_a_row_with_every_key_masked_is_nan_as_in_the_reference():
    rng = np.random.default_rng(1)
    q = heads(rng, 1, 1, 3, 4, np.float64)
    mask = np.zeros((1, 1, 3, 3))
    mask[0, 0, 1] = -np.inf
    out, probs = NB.attention(q, q, q, mask, False, 1.0)
    want, _ = NP.attention(q, q, q, mask, False, 1.0)
    assert np.isnan(out[0, 0, 1]).all() and np.isnan(want[0, 0, 1]).all()
    np.testing.assert_allclose(out[0, 0, [0, 2]], want[0, 0, [0, 2]], rtol=1e-12)


def test_long_sequences_take_the_reference(monkeypatch):
    rng = np.random.default_rng(2)
    length = int(np.sqrt(numba_attention.MAX_SCORES)) + 1
    q = heads(rng, 1, 1, length, 8, np.float64)
    calls = []
    monkeypatch.setattr("tensorcore.backends.numba.kernels.attention.attention_heads",
                        lambda *args: calls.append(args))
    out, _ = NB.attention(q, q, q, None, False, 0.5)
    assert not calls
    np.testing.assert_allclose(out, NP.attention(q, q, q, None, False, 0.5)[0], rtol=1e-12)


def test_gradients_by_central_differences():
    """Through ``scaled_dot_product_attention`` on the Numba backend, float64, the heads
    as permuted views, with a mask."""
    if tc.get_backend().name != "numba":
        pytest.skip("the Numba backend's kernel")
    rng = np.random.default_rng(3)
    b, h, lq, lk, d = 2, 2, 3, 4, 5
    arrays = [rng.standard_normal((b, n, h, d)) for n in (lq, lk, lk)]
    mask = tc.tensor(rng.standard_normal((lq, lk)))
    weight = rng.standard_normal((b, h, lq, d))

    def loss(*xs):
        q, k, v = (x.permute(0, 2, 1, 3) for x in xs)
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=mask) * tc.tensor(weight)).sum()

    leaves = [tc.tensor(a, requires_grad=True) for a in arrays]
    loss(*leaves).backward()
    eps = 1e-6
    for i, a in enumerate(arrays):
        numeric = np.zeros_like(a)
        for index in np.ndindex(a.shape):
            up, down = [x.copy() for x in arrays], [x.copy() for x in arrays]
            up[i][index] += eps
            down[i][index] -= eps
            numeric[index] = (loss(*map(tc.tensor, up)).item() - loss(*map(tc.tensor, down)).item()) / (2 * eps)
        np.testing.assert_allclose(leaves[i].grad.numpy(), numeric, rtol=1e-6, atol=1e-8)
