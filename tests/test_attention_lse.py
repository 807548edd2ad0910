"""The reference backward from an attention's output and log-sum-exp
(``attention_lse_backward``, what flash attention's backward computes on the GPU).

In float64 it equals the backward from the saved probabilities, over batches, heads,
lengths, head dims and causal masking; and the CPU backends keep the probabilities
(``attention_lse`` is None there), so the op's training path on the CPU is unchanged.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tensorcore.backends.numpy.backend import NumpyBackend

NP = NumpyBackend()


@settings(max_examples=40)
@given(b=st.integers(1, 2), h=st.integers(1, 3), lq=st.integers(1, 24), lk=st.integers(1, 24),
       d=st.integers(1, 20), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_lse_backward_equals_the_probabilities_backward(b, h, lq, lk, d, causal, seed) -> None:
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, h, n, d)) for n in (lq, lk, lk))
    grad = rng.standard_normal((b, h, lq, d))
    scale = 1 / math.sqrt(d)
    out, probs = NP.attention(q, k, v, None, causal, scale)
    scores = NP._attention_scores(q, k, causal, scale)
    top = scores.max(-1, keepdims=True)
    lse = (top[..., 0] + np.log(np.exp(scores - top).sum(-1))) / math.log(2)  # base 2
    got = NP.attention_lse_backward(grad, q, k, v, out, lse, causal, scale)
    want = NP.attention_backward(grad, q, k, v, probs, scale)
    for x, w in zip(got, want):
        np.testing.assert_allclose(x, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["numpy", "numba"])
def test_cpu_backends_keep_the_probabilities(name) -> None:
    if name == "numba":
        pytest.importorskip("numba")
        from tensorcore.backends.numba.backend import NumbaBackend as Backend
    else:
        Backend = NumpyBackend
    x = np.ones((1, 1, 4, 8), dtype=np.float32)
    assert Backend().attention_lse(x, x, x, None, False, 0.5) is None
