"""``lane_map``: a fixed map of a few rows into a few rows, in vector registers.

The Winograd tile transforms through it give the bits NumPy gives when it evaluates
the same expressions one operation at a time, for lengths around the vector width
(the vector loop and its scalar tail), at any offsets and row steps, and nothing
outside the destination rows is written.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

pytest.importorskip("numba")

from numba import errors, njit  # noqa: E402

from tensorcore.backends.numba.kernels.lane_maps import lane_map, lane_transpose  # noqa: E402
from tensorcore.backends.numba.kernels.winograd import (  # noqa: E402
    _a_adjoint, _a_transform, _b_transform)

_TRANSFORMS = {"B^T": (_b_transform, 6, 6), "A^T": (_a_transform, 6, 4), "A": (_a_adjoint, 4, 6)}


@njit(error_model="numpy")
def _b_rows(dst, dst_at, dst_step, src, src_at, src_step, n):
    lane_map(_b_transform, dst, dst_at, dst_step, src, src_at, src_step, n)


@njit(error_model="numpy")
def _a_rows(dst, dst_at, dst_step, src, src_at, src_step, n):
    lane_map(_a_transform, dst, dst_at, dst_step, src, src_at, src_step, n)


@njit(error_model="numpy")
def _adjoint_rows(dst, dst_at, dst_step, src, src_at, src_step, n):
    lane_map(_a_adjoint, dst, dst_at, dst_step, src, src_at, src_step, n)


_KERNELS = {"B^T": _b_rows, "A^T": _a_rows, "A": _adjoint_rows}


@given(name=st.sampled_from(sorted(_TRANSFORMS)), dtype=st.sampled_from([np.float32, np.float64]),
       n=st.integers(0, 70), gap=st.integers(0, 9), src_at=st.integers(0, 5), dst_at=st.integers(0, 5),
       seed=st.integers(0, 2**16))
def test_the_rows_get_the_bits_of_the_scalar_expressions(name: str, dtype: type, n: int, gap: int,
                                                        src_at: int, dst_at: int, seed: int) -> None:
    transform, inputs, outputs = _TRANSFORMS[name]
    rng = np.random.default_rng(seed)
    step = n + gap
    src = rng.standard_normal(src_at + inputs * step + 3).astype(dtype)
    dst = rng.standard_normal(dst_at + outputs * step + 3).astype(dtype)
    before = dst.copy()
    _KERNELS[name](dst.reshape(1, -1), dst_at, step, src.reshape(1, -1), src_at, step, n)

    rows = [src[src_at + k * step:src_at + k * step + n] for k in range(inputs)]
    want = transform.py_func(dtype, *rows)  # NumPy: one rounding per operation, as the kernel
    written = np.zeros(dst.size, bool)
    for j, row in enumerate(want):
        at = dst_at + j * step
        assert dst[at:at + n].tobytes() == np.asarray(row, dtype).tobytes()
        written[at:at + n] = True
    assert np.array_equal(dst[~written], before[~written])


def test_the_transform_of_a_column_is_its_matrix_product() -> None:
    """B^T d for one column against the float64 matrix."""
    b_t = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                    [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64)
    d = np.random.default_rng(1).standard_normal((6, 37))
    out = np.empty((6, 37))
    _b_rows(out, 0, 37, np.ascontiguousarray(d), 0, 37, 37)
    np.testing.assert_allclose(out, b_t @ d, rtol=1e-14, atol=1e-13)


def test_rows_of_a_strided_array_are_refused() -> None:
    x = np.zeros((6, 32), np.float32)
    with pytest.raises(errors.TypingError, match="C-contiguous"):
        _b_rows(x[:, ::2], 0, 16, x, 0, 32, 16)


@njit(error_model="numpy")
def _transpose(dst, dst_at, dst_row, src, src_at, src_row, rows, cols, wrap, gap):
    lane_transpose(dst, dst_at, dst_row, src, src_at, src_row, rows, cols, wrap, gap)


@given(dtype=st.sampled_from([np.float32, np.float64]), rows=st.integers(0, 40), cols=st.integers(0, 40),
       src_gap=st.integers(0, 5), dst_gap=st.integers(0, 5), src_at=st.integers(0, 7), dst_at=st.integers(0, 7),
       wrap=st.sampled_from([1, 2, 4, 5, 8, 16, 32, 48]), gap=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_a_transpose_moves_every_value_and_nothing_else(dtype: type, rows: int, cols: int, src_gap: int,
                                                       dst_gap: int, src_at: int, dst_at: int, wrap: int,
                                                       gap: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    src_row, dst_row = cols + src_gap, rows + dst_gap
    src = rng.standard_normal(src_at + rows * src_row + 2).astype(dtype)
    dst = rng.standard_normal(dst_at + cols * dst_row + (cols // wrap) * gap + 2).astype(dtype)
    before = dst.copy()
    _transpose(dst.reshape(1, -1), dst_at, dst_row, src.reshape(1, -1), src_at, src_row, rows, cols, wrap, gap)
    written = np.zeros(dst.size, bool)
    for j in range(cols):
        start = dst_at + j * dst_row + (j // wrap) * gap
        column = src[src_at + j:src_at + j + rows * src_row:src_row] if rows else src[:0]
        assert np.array_equal(dst[start:start + rows], column)
        written[start:start + rows] = True
    assert np.array_equal(dst[~written], before[~written])
