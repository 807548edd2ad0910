"""The Numba kernels' float32 math (``numba/kernels/mathfn.py``) against float64.

``fexp``, ``fnormcdf`` and ``ftanh`` on float32 are polynomial forms (fused multiply-adds,
one bit cast) so loops over them vectorise; each must stay within a few float32 ulps of
the float64 function over the whole range the kernels feed them, with exact tails.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from numba import njit

from tensorcore.backends.numba.kernels.mathfn import fexp, fnormcdf, ftanh


@njit
def _apply(which, x):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = fexp(x[i]) if which == 0 else (fnormcdf(x[i]) if which == 1 else ftanh(x[i]))
    return out


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in float32 ulps of want (the smallest normal's ulp near zero)."""
    spacing = np.spacing(np.maximum(np.abs(want), np.finfo(np.float32).tiny).astype(np.float32))
    return np.abs(got.astype(np.float64) - want) / spacing


def _grid(lo: float, hi: float) -> np.ndarray:
    return np.linspace(lo, hi, 200_001, dtype=np.float32)


def test_exp_is_within_two_ulps_and_its_tails_are_exact() -> None:
    x = _grid(-87.3, 88.7)
    want = np.exp(x.astype(np.float64))
    assert _ulps(_apply(0, x), want).max() <= 2.0
    tails = np.array([-1e30, -200.0, -87.4, 88.8, 200.0, 1e30, -np.inf, np.inf], np.float32)
    np.testing.assert_array_equal(_apply(0, tails), [0, 0, 0, np.inf, np.inf, np.inf, 0, np.inf])


@given(st.floats(-87.0, 88.0, width=32))
def test_exp_of_any_float32_in_range(x: float) -> None:
    got = _apply(0, np.array([x], np.float32))
    assert _ulps(got, np.array([math.exp(x)]))[0] <= 2.0


def test_normal_cdf_and_tanh_against_float64() -> None:
    x = _grid(-12.0, 12.0)
    x64 = x.astype(np.float64)
    cdf = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x64[::50]])
    # 7.1.26's erfc bound (1.5e-7, halved) plus float32 rounding of values near 1
    assert np.abs(_apply(1, x[::50]) - cdf).max() <= 3e-7
    assert _ulps(_apply(2, x), np.tanh(x64)).max() <= 4.0
    float64 = np.linspace(-5.0, 5.0, 101)  # float64 arguments take math's own functions
    np.testing.assert_allclose(_apply(0, float64), np.exp(float64), rtol=1e-15)
