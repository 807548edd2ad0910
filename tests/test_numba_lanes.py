"""``lane_sum``: the vectorised sums of the Numba kernels, in a fixed order.

Each term kind against a float64 sum, for lengths around the vector and block sizes;
a strided view (the scalar loop) gives the bits of its contiguous copy (the vector
loop), so the order of additions is the documented one on both paths.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

pytest.importorskip("numba")

from numba import njit  # noqa: E402

from tensorcore.backends.numba.kernels.lanes import (  # noqa: E402
    DOT, DOT_DEVIATION, SQUARED_DEVIATION, SUM, lane_axpy, lane_sum)
from tensorcore.backends.numba.kernels.reductions import row_max  # noqa: E402


@njit(error_model="numpy")
def _all_kinds(x, y, m):
    return (lane_sum(SUM, x, x, m), lane_sum(DOT, x, y, m), lane_sum(SQUARED_DEVIATION, x, x, m),
            lane_sum(DOT_DEVIATION, x, y, m))


def _reference(x: np.ndarray, y: np.ndarray, m: float) -> tuple[float, ...]:
    x, y = x.astype(np.float64), y.astype(np.float64)
    return x.sum(), (x * y).sum(), ((x - m) ** 2).sum(), (x * (y - m)).sum()


@given(n=st.integers(0, 300), dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
def test_each_term_sums_as_float64_does(n: int, dtype: type, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
    m = dtype(rng.standard_normal())
    got = _all_kinds(x, y, m)
    scale = np.abs(x).sum() * (1 + np.abs(y).max(initial=0) + abs(m)) + abs(m) ** 2 * n + 1
    tol = (1e-6 if dtype == np.float32 else 1e-14) * scale
    for value, want in zip(got, _reference(x, y, float(m))):
        assert abs(float(value) - want) <= tol


@given(n=st.integers(0, 400), step=st.integers(2, 3), seed=st.integers(0, 2**16))
def test_a_strided_view_sums_in_the_order_of_its_contiguous_copy(n: int, step: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal(n * step).astype(np.float32), rng.standard_normal(n * step).astype(np.float32)
    m = np.float32(0.25)
    strided = _all_kinds(x[::step], y[::step], m)
    contiguous = _all_kinds(np.ascontiguousarray(x[::step]), np.ascontiguousarray(y[::step]), m)
    assert [np.float32(v).tobytes() for v in strided] == [np.float32(v).tobytes() for v in contiguous]


def test_the_order_is_accumulators_then_halves_then_the_tail() -> None:
    """16 float32 lanes, four accumulators over blocks of 64: sums only that order gives."""
    big = np.float32(2.0**24)  # big + 1 rounds back to big; big + 2 is exact
    x = np.zeros(67, np.float32)
    x[0], x[32], x[48] = big, 1, 1  # lane 0 of accumulators 0, 2, 3: (a0 + a1) + (a2 + a3)
    assert _all_kinds(x, x, np.float32(0.0))[0] == big + 2  # in index order: big
    x[:] = 0
    x[0], x[64], x[65] = big, 1, 1  # the tail, added one by one after the vectors
    assert _all_kinds(x, x, np.float32(0.0))[0] == big  # pairwise: big + 2


@njit(error_model="numpy")
def _axpy(dst, w, src):
    lane_axpy(dst, w, src)


@given(n=st.integers(0, 100), dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
def test_axpy_rounds_each_value_as_the_scalar_expression(n: int, dtype: type, seed: int) -> None:
    """Every length (vector part and tail): dst + w * src, a product then a sum, as NumPy rounds it."""
    rng = np.random.default_rng(seed)
    dst, src = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
    w = dtype(rng.standard_normal())
    want = dst + w * src
    _axpy(dst, w, src)
    np.testing.assert_array_equal(dst, want)


@njit(error_model="numpy")
def _row_max(row):
    return row_max(row)


@pytest.mark.parametrize("n", [1, 5, 16, 63, 64, 65, 200])
def test_row_max_short_and_long_rows(n: int) -> None:
    rng = np.random.default_rng(n)
    row = rng.standard_normal(n).astype(np.float32)
    assert _row_max(row) == row.max()
    row[n // 2] = np.inf
    assert _row_max(row) == np.inf
    if n < 64:  # a short row's NaN wins, wherever it lies
        for at in {0, n // 2, n - 1}:
            nan_row = row.copy()
            nan_row[at] = np.nan
            assert np.isnan(_row_max(nan_row))
