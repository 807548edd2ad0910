"""A stack of matrices times one matrix, on the CPU backends: one product of all the rows.

``stacked_rows`` hands BLAS [..., M, K] @ [K, N] as one [-1, K] @ [K, N] product.  The
result matches float64, is written into a given ``out``, and a compiled replay gives
eager's bits; operands it cannot view as rows (a strided stack, a strided ``out``) take
NumPy's own stacked product.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tensorcore as tc
from tensorcore.backends.numpy.backend import stacked_rows


@pytest.fixture(params=["numpy", "numba"])
def backend(request):
    if request.param == "numba":
        pytest.importorskip("numba")
    with tc.use_backend(request.param):
        yield tc.get_backend()


@given(lead=st.lists(st.integers(1, 4), min_size=1, max_size=2), m=st.integers(1, 9), k=st.integers(1, 9),
       n=st.integers(1, 9), dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
def test_the_stacked_product_matches_float64(backend, lead, m, k, n, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((*lead, m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = backend.matmul(a, b)
    assert got.shape == want.shape and got.dtype == dtype
    tol = (1e-5 if dtype == np.float32 else 1e-13) * (1 + np.abs(a).max() * np.abs(b).max() * k)
    np.testing.assert_allclose(got, want, atol=tol, rtol=0)
    out = np.full(want.shape, np.nan, dtype)
    assert backend.matmul(a, b, out=out) is out
    assert out.tobytes() == got.tobytes()


def test_only_contiguous_stacks_times_a_matrix_become_rows():
    a = np.ones((2, 3, 4), np.float32)
    b = np.ones((4, 5), np.float32)
    rows = stacked_rows(a, b)
    assert rows is not None and rows[0].shape == (6, 4) and np.shares_memory(rows[0], a) and rows[2] is None
    out = np.empty((2, 3, 5), np.float32)
    assert np.shares_memory(stacked_rows(a, b, out)[2], out)
    assert stacked_rows(a.transpose(1, 0, 2), b) is None  # strided stack
    assert stacked_rows(a, b, np.empty((2, 5, 3), np.float32).transpose(0, 2, 1)) is None  # strided out
    assert stacked_rows(a, np.ones((2, 4, 5), np.float32)) is None  # a stack of b's
    assert stacked_rows(a[0], b) is None  # already 2-D
    assert stacked_rows(np.ones((0, 3, 4), np.float32), b) is None


def test_strided_operands_still_multiply_correctly(backend):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4, 5)).astype(np.float32).transpose(0, 2, 1)  # [3, 5, 4], strided
    b = rng.standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_allclose(backend.matmul(a, b), a.astype(np.float64) @ b, atol=1e-5)


def test_a_compiled_linear_on_sequences_replays_eagers_bits(backend):
    import layers

    tc.manual_seed(0)
    model = layers.Sequential(layers.Linear(16, 24), layers.GELU(), layers.Linear(24, 8)).eval()
    compiled = tc.compile(model, cache_dir=False)
    with tc.no_grad():
        for seed in range(3):
            x = tc.randn(4, 5, 16) * (seed + 1)
            assert compiled(x).numpy().tobytes() == model(x).numpy().tobytes()
