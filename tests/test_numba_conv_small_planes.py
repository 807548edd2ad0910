"""The Numba backend's convolution routes for batches of small planes against the NumPy
reference in float64: Winograd with one image per task and the transforms vectorised
across the channels (WINOGRAD_BATCH), stride 2 through it (SUBSAMPLED), 1x1 convolutions as one GEMM per
image (POINTWISE), and the
Kronecker-product weight transforms both Winograd routes share.  Gradients are also
checked as what they are, derivatives of <conv2d(x, w), g>, by central differences.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorcore.backends.numba import spatial
from tensorcore.backends.numba.backend import NumbaBackend
from tensorcore.backends.numba.kernels.winograd import weight_tiles, weight_grad
from tensorcore.backends.numpy.backend import NumpyBackend

NB, NP = NumbaBackend(), NumpyBackend()
DTYPES = [np.float32, np.float64]


def rand(shape, dtype, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def out_plane(hw, padding, k):
    return tuple(hw[i] + 2 * padding[i] - k + 1 for i in range(2))


def assert_close_to_f64(fast, ref, dtype, float32_atol=1e-5):
    """fast (in ``dtype``) matches the float64 ``ref``: to rounding in float64, in
    float32 to ``float32_atol`` of the output's magnitude (Winograd's transforms scale
    values by up to ~100 before they round)."""
    assert fast.dtype == dtype and fast.shape == ref.shape
    atol = (1e-10 if dtype == np.float64 else float32_atol) * max(1.0, np.abs(ref).max())
    np.testing.assert_allclose(fast, ref, rtol=0, atol=atol)


def check_passes(xs, ws, geo, dtype, bias=False, act="none", float32_atol=1e-5):
    """Forward (with its epilogue), input and weight gradient against the float64
    reference; returns the three results."""
    x, w, b = rand(xs, dtype, 1), rand(ws, dtype, 2, 0.3), rand((ws[0],), dtype, 3) if bias else None
    x64, w64, b64 = x.astype(np.float64), w.astype(np.float64), None if b is None else b.astype(np.float64)
    y = NB.conv2d(x, w, *geo, b, act)
    assert_close_to_f64(y, NP.conv2d(x64, w64, *geo, b64, act), dtype, float32_atol)
    g = rand(y.shape, dtype, 4)
    g64 = g.astype(np.float64)
    dx = NB.conv2d_grad_input(g, w, xs, *geo)
    assert_close_to_f64(dx, NP.conv2d_grad_input(g64, w64, xs, *geo), dtype, float32_atol)
    dw = NB.conv2d_grad_weight(g, x, ws, *geo)
    assert_close_to_f64(dw, NP.conv2d_grad_weight(g64, x64, ws, *geo), dtype, float32_atol)
    return y, dx, dw


def check_central_differences(xs, ws, geo):
    """In float64, the gradients of L(x, w) = <conv2d(x, w), g> along random directions
    equal (L(. + h d) - L(. - h d)) / 2h (exact up to rounding: L is linear in each)."""
    x, w = rand(xs, np.float64, 5), rand(ws, np.float64, 6)
    g = rand(NB.conv2d(x, w, *geo).shape, np.float64, 7)
    dx_dir, dw_dir = rand(xs, np.float64, 8), rand(ws, np.float64, 9)

    def loss(xv, wv):
        return float(np.sum(NB.conv2d(xv, wv, *geo) * g))

    h = 1e-3
    along_x = (loss(x + h * dx_dir, w) - loss(x - h * dx_dir, w)) / (2 * h)
    along_w = (loss(x, w + h * dw_dir) - loss(x, w - h * dw_dir)) / (2 * h)
    np.testing.assert_allclose(np.sum(NB.conv2d_grad_input(g, w, xs, *geo) * dx_dir), along_x, rtol=1e-8)
    np.testing.assert_allclose(np.sum(NB.conv2d_grad_weight(g, x, ws, *geo) * dw_dir), along_w, rtol=1e-8)


# ----- Winograd, one image per task, the transforms vectorised across the channels -----
@given(n=st.integers(spatial.BATCH_MIN_IMAGES, spatial.BATCH_MIN_IMAGES + 3),
       c=st.integers(spatial.BATCH_MIN_CHANNELS, spatial.BATCH_MIN_CHANNELS + 5),
       cout=st.integers(spatial.BATCH_MIN_CHANNELS, spatial.BATCH_MIN_CHANNELS + 5),
       hw=st.tuples(st.integers(1, 13), st.integers(1, 13)),
       padding=st.tuples(st.integers(0, 2), st.integers(0, 2)), dtype=st.sampled_from(DTYPES))
def test_winograd_batch_matches_reference(n, c, cout, hw, padding, dtype):
    """All three passes over plane sizes (partial tiles, planes under one tile), padding
    and channel counts, the forward with a bias and an activation."""
    ho, wo = out_plane(hw, padding, 3)
    if min(ho, wo) < 1:
        return
    xs, ws, geo = (n, c) + hw, (cout, c, 3, 3), ((1, 1), padding, (1, 1), 1)
    for pass_name, plane in (("forward", (ho, wo)), ("grad_input", hw), ("grad_weight", (ho, wo))):
        assert spatial.conv_algorithm(pass_name, ws, *geo, n, plane) == spatial.WINOGRAD_BATCH
    check_passes(xs, ws, geo, dtype, bias=True, act="silu", float32_atol=2e-5)


@pytest.mark.parametrize("xs, cout", [((64, 64, 4, 4), 64), ((64, 32, 8, 8), 32), ((64, 96, 8, 8), 32),
                                      ((64, 128, 4, 4), 64)])
def test_winograd_batch_on_the_digits_unet_shapes(xs, cout):
    """The digits UNet's 3x3 convolutions at its training batch, float32, and the same
    bits on a second call."""
    ws, geo = (cout, xs[1], 3, 3), ((1, 1), (1, 1), (1, 1), 1)
    assert spatial.conv_algorithm("forward", ws, *geo, xs[0], xs[2:]) == spatial.WINOGRAD_BATCH
    first = check_passes(xs, ws, geo, np.float32, bias=True, float32_atol=2e-5)
    again = check_passes(xs, ws, geo, np.float32, bias=True, float32_atol=2e-5)
    for a, b in zip(first, again):
        assert np.array_equal(a, b)


def test_winograd_batch_leaves_wide_padding_and_few_images_to_other_routes():
    ws, n, geo = (32, 32, 3, 3), spatial.BATCH_MIN_IMAGES, ((1, 1), (3, 3), (1, 1), 1)
    assert spatial.conv_algorithm("forward", ws, *geo, n, (10, 10)) == spatial.WINOGRAD_BATCH
    assert spatial.conv_algorithm("grad_input", ws, *geo, n, (6, 6)) == spatial.IM2COL
    assert spatial.conv_algorithm("forward", ws, *geo, n - 1, (10, 10)) == spatial.IM2COL
    thin = (spatial.BATCH_MIN_CHANNELS - 1, 32, 3, 3)
    assert spatial.conv_algorithm("forward", thin, *geo, n, (10, 10)) == spatial.IM2COL


def test_winograd_batch_padding_three_takes_im2col_for_the_input_gradient():
    """Forward and weight gradient through Winograd, the input gradient through im2col."""
    check_passes((16, 16, 5, 6), (16, 16, 3, 3), ((1, 1), (3, 3), (1, 1), 1), np.float32, float32_atol=2e-5)


@pytest.mark.parametrize("xs, cout, padding", [((16, 16, 4, 4), 16, (1, 1)), ((17, 18, 5, 7), 16, (0, 2)),
                                               ((16, 16, 9, 3), 20, (2, 1))])
def test_winograd_batch_gradients_by_central_differences(xs, cout, padding):
    geo = ((1, 1), padding, (1, 1), 1)
    assert spatial.conv_algorithm("grad_weight", (cout, xs[1], 3, 3), *geo, xs[0],
                                  out_plane(xs[2:], padding, 3)) == spatial.WINOGRAD_BATCH
    check_central_differences(xs, (cout, xs[1], 3, 3), geo)


# ----- stride 2 as the stride-1 convolution read at every other output ------------------
def strided_plane(hw, padding):
    return tuple((hw[i] + 2 * padding[i] - 3) // 2 + 1 for i in range(2))


@given(n=st.integers(spatial.BATCH_MIN_IMAGES, spatial.BATCH_MIN_IMAGES + 2),
       c=st.integers(spatial.BATCH_MIN_CHANNELS, spatial.BATCH_MIN_CHANNELS + 3),
       cout=st.integers(spatial.BATCH_MIN_CHANNELS, spatial.BATCH_MIN_CHANNELS + 3),
       hw=st.tuples(st.integers(1, 8), st.integers(1, 8)),
       padding=st.tuples(st.integers(0, 2), st.integers(0, 2)), dtype=st.sampled_from(DTYPES))
def test_subsampled_matches_reference(n, c, cout, hw, padding, dtype):
    """Stride-2 3x3 convolutions on planes up to 8x8: all three passes, odd sizes (the
    stride-1 plane one longer than twice the strided one) included."""
    ho, wo = strided_plane(hw, padding)
    if min(ho, wo) < 1:
        return
    xs, ws, geo = (n, c) + hw, (cout, c, 3, 3), ((2, 2), padding, (1, 1), 1)
    dense_tiles = -(-(hw[0] + 2 * padding[0] - 2) // 4) * -(-(hw[1] + 2 * padding[1] - 2) // 4)
    expected = spatial.SUBSAMPLED if dense_tiles <= spatial.SUBSAMPLED_MAX_TILES else spatial.IM2COL
    assert spatial.conv_algorithm("grad_input", ws, *geo, n, hw) == expected
    check_passes(xs, ws, geo, dtype, bias=True, act="relu", float32_atol=2e-5)


def test_subsampled_takes_the_digits_unet_downsampler():
    xs, ws, geo = (64, 32, 8, 8), (32, 32, 3, 3), ((2, 2), (1, 1), (1, 1), 1)
    for pass_name, plane in (("forward", (4, 4)), ("grad_input", (8, 8)), ("grad_weight", (4, 4))):
        assert spatial.conv_algorithm(pass_name, ws, *geo, 64, plane) == spatial.SUBSAMPLED
    assert spatial.conv_algorithm("forward", ws, *geo, 64, (8, 8)) == spatial.IM2COL  # 16x16 at stride 1
    check_passes(xs, ws, geo, np.float32, bias=True, float32_atol=2e-5)


def test_subsampled_gradients_by_central_differences():
    check_central_differences((16, 16, 7, 6), (18, 16, 3, 3), ((2, 2), (1, 2), (1, 1), 1))


# ----- 1x1 convolutions as one GEMM per image -------------------------------------------
@given(n=st.integers(1, 5), groups=st.integers(1, 3), cin_g=st.integers(1, 9), cout_g=st.integers(2, 9),
       hw=st.tuples(st.integers(1, 9), st.integers(1, 9)), act=st.sampled_from(["none", "relu", "gelu"]),
       dtype=st.sampled_from(DTYPES))
def test_pointwise_matches_reference(n, groups, cin_g, cout_g, hw, act, dtype):
    """All three passes of 1x1 stride-1 convolutions over groups and plane sizes; short
    contractions keep their forward on the direct loop."""
    xs, ws, geo = (n, cin_g * groups) + hw, (cout_g * groups, cin_g, 1, 1), ((1, 1), (0, 0), (1, 1), groups)
    expected = spatial.DIRECT if cin_g <= spatial.SMALL_K else spatial.POINTWISE
    assert spatial.conv_algorithm("forward", ws, *geo, n, hw) == expected
    assert spatial.conv_algorithm("grad_input", ws, *geo, n, hw) == spatial.POINTWISE
    check_passes(xs, ws, geo, dtype, bias=True, act=act)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("xs, cout", [((64, 96, 4, 4), 64), ((64, 64, 8, 8), 32), ((3, 40, 5, 7), 24)])
def test_pointwise_forward_takes_the_per_image_gemm(xs, cout, dtype):
    ws, geo = (cout, xs[1], 1, 1), ((1, 1), (0, 0), (1, 1), 1)
    assert spatial.conv_algorithm("forward", ws, *geo, xs[0], xs[2:]) == spatial.POINTWISE
    check_passes(xs, ws, geo, dtype, bias=True, act="silu")


def test_pointwise_leaves_strided_and_padded_1x1_to_im2col():
    ws = (32, 32, 1, 1)
    assert spatial.conv_algorithm("forward", ws, (2, 2), (0, 0), (1, 1), 1, 8, (4, 4)) == spatial.IM2COL
    assert spatial.conv_algorithm("grad_input", ws, (1, 1), (1, 1), (1, 1), 1, 8, (8, 8)) == spatial.IM2COL


def test_pointwise_gradients_by_central_differences():
    check_central_differences((3, 24, 5, 4), (20, 12, 1, 1), ((1, 1), (0, 0), (1, 1), 2))


# ----- the weight transforms as products with G (x) G -----------------------------------
G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
              [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])


@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_tiles_are_g_w_gt_per_kernel(dtype):
    w = rand((5, 3, 3, 3), dtype, 1)
    expected = np.einsum("ka,oiab,lb->kloi", G, w.astype(np.float64), G).reshape(36, 5, 3)
    u = weight_tiles(w)
    assert u.dtype == dtype
    assert_close_to_f64(u, expected, dtype, float32_atol=1e-6)
    flipped = np.ascontiguousarray(w[:, :, ::-1, ::-1])
    assert_close_to_f64(weight_tiles(w, flipped=True), weight_tiles(flipped), dtype, float32_atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_grad_is_the_adjoint_of_weight_tiles(dtype):
    w, du = rand((4, 6, 3, 3), dtype, 1), rand((36, 4, 6), dtype, 2)
    dw = weight_grad(du)
    assert dw.dtype == dtype and dw.shape == w.shape
    lhs = np.sum(weight_tiles(w).astype(np.float64) * du)
    rhs = np.sum(w.astype(np.float64) * dw)
    np.testing.assert_allclose(lhs, rhs, rtol=1e-5 if dtype == np.float32 else 1e-12)
