"""``batched_matmul``: batches of small matrix products from register blocks.

Against float64 products (hypothesis over batch, rows, depth, columns around the block
sizes, strided and transposed left operands, both dtypes); the same bits on one thread
and on two; shapes the kernel cannot take (columns not a whole register, strided
rows) go to NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

pytest.importorskip("numba")

import tensorcore as tc  # noqa: E402
from tensorcore.backends.numba.kernels import block_products  # noqa: E402
from tensorcore.backends.numba.kernels.block_products import batched_matmul  # noqa: E402


def _bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A rounding bound per output value: depth * eps * sum |a||b|."""
    eps = np.finfo(a.dtype).eps
    return a.shape[2] * eps * np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64)) + 1e-30


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list:
    """Records each call of the kernel (so a test knows NumPy did not take the product)."""
    calls: list = []
    kernel = block_products.batched_products_

    def spy(*args):
        calls.append(args)
        return kernel(*args)
    monkeypatch.setattr(block_products, "batched_products_", spy)
    return calls


@given(batch=st.integers(1, 5), rows=st.integers(1, 20), depth=st.integers(0, 40),
       registers=st.integers(1, 5), dtype=st.sampled_from([np.float32, np.float64]),
       transposed=st.booleans(), seed=st.integers(0, 2**16))
def test_products_match_float64(kernel_calls: list, batch: int, rows: int, depth: int, registers: int,
                                dtype: type, transposed: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cols = registers * (128 // np.dtype(dtype).itemsize)  # whole register blocks
    a = rng.standard_normal((batch, rows, depth)).astype(dtype)
    if transposed:  # the weight gradient's left operand: a transposed view
        a = np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1)
    b = rng.standard_normal((batch, depth, cols)).astype(dtype)
    out = np.full((batch, rows, cols), np.nan, dtype)
    calls = len(kernel_calls)
    batched_matmul(a, b, out)
    assert len(kernel_calls) == calls + (depth > 0)  # empty operands: NumPy (zero strides)
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert np.all(np.abs(out - exact) <= _bound(a, b))


def test_every_row_and_column_block_is_written(kernel_calls: list) -> None:
    """Rows past the last whole block of eight, into a strided view of a larger array
    (left untouched around it)."""
    a = np.arange(2 * 13 * 3, dtype=np.float32).reshape(2, 13, 3)
    b = np.arange(2 * 3 * 64, dtype=np.float32).reshape(2, 3, 64)
    whole = np.full((13, 2, 80), np.nan, np.float32)
    out = whole[:, :, 8:72].transpose(1, 0, 2)
    batched_matmul(a, b, out)
    assert len(kernel_calls) == 1
    np.testing.assert_array_equal(out, np.matmul(a, b))  # small integers: exact
    assert np.isnan(whole[:, :, :8]).all() and np.isnan(whole[:, :, 72:]).all()


def test_same_bits_on_one_thread_and_two() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((36, 64, 64)).astype(np.float32)
    b = rng.standard_normal((36, 64, 64)).astype(np.float32)
    threads = tc.get_num_threads()
    try:
        tc.set_num_threads(1)
        one = batched_matmul(a, b)
        tc.set_num_threads(2)
        two = batched_matmul(a, b)
    finally:
        tc.set_num_threads(threads)
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("case", ["odd_columns", "strided_b", "float16", "strided_out", "large"])
def test_shapes_the_kernel_cannot_take_go_to_numpy(kernel_calls: list, case: str) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 5, 7)).astype(np.float32)
    b = rng.standard_normal((3, 7, 32)).astype(np.float32)
    out = None
    if case == "odd_columns":
        b = b[:, :, :16]  # half a register block
    elif case == "strided_b":
        b = np.repeat(b, 2, axis=2)[:, :, ::2]  # the same values, every other one
    elif case == "float16":
        a, b = a.astype(np.float16), b.astype(np.float16)
    elif case == "strided_out":
        out = np.empty((3, 5, 64), np.float32)[:, :, ::2]
    else:  # one product past LARGEST_PRODUCT: BLAS splits it across threads itself
        a = rng.standard_normal((2, 256, 128)).astype(np.float32)
        b = rng.standard_normal((2, 128, 128)).astype(np.float32)
        assert a.shape[1] * a.shape[2] * b.shape[2] > block_products.LARGEST_PRODUCT
    got = batched_matmul(a, b, out)
    np.testing.assert_allclose(got.astype(np.float64), np.matmul(a.astype(np.float64), b.astype(np.float64)),
                               rtol=1e-2 if case == "float16" else 1e-5, atol=1e-2 if case == "float16" else 1e-5)
    assert not kernel_calls
    if out is not None:
        assert got is out
