"""The NumPy reference kernels: forwards against naive float64 loops (and PyTorch when
it is installed), backwards against central finite differences in float64."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tensorcore.backends.numpy.nn import NumpyNNKernels
from tensorcore.backends.numpy.special import erf

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


class K(NumpyNNKernels):
    xp = np


k = K()
ACTS = ("none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


def numeric_grad(loss, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar ``loss()`` w.r.t. each entry of ``x``, which
    is perturbed in place and restored."""
    flat = x.reshape(-1)
    assert np.shares_memory(flat, x)
    grad = np.zeros(flat.size)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        hi = loss()
        flat[i] = old - eps
        lo = loss()
        flat[i] = old
        grad[i] = (hi - lo) / (2 * eps)
    return grad.reshape(x.shape)


def assert_grad(analytic: np.ndarray, loss, x: np.ndarray, atol: float = 1e-6) -> None:
    np.testing.assert_allclose(analytic, numeric_grad(loss, x), rtol=1e-5, atol=atol)


def t(a: np.ndarray, grad: bool = False):
    return torch.tensor(a, requires_grad=grad)


# ----- erf and activations -------------------------------------------------------------
def test_erf_matches_math_erf_in_float64():
    x = np.concatenate([np.linspace(-7, 7, 20001), [0.46875, -0.46875, 4.0, -4.0, 30.0]])
    ref = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(erf(np, x), ref, rtol=0, atol=1e-15)


def test_erf_special_values_and_dtypes():
    out = erf(np, np.array([np.inf, -np.inf, np.nan, -0.0]))
    assert out[0] == 1.0 and out[1] == -1.0 and np.isnan(out[2])
    assert np.signbit(out[3])
    x32 = np.linspace(-5, 5, 101, dtype=np.float32)
    assert erf(np, x32).dtype == np.float32
    np.testing.assert_allclose(erf(np, x32), [math.erf(v) for v in x32], atol=1e-6)
    assert erf(np, x32.astype(np.float16)).dtype == np.float16


def _reference_activation(act: str, x: np.ndarray) -> np.ndarray:
    if act == "none":
        return x
    if act == "relu":
        return np.where(x > 0, x, 0.0)
    if act == "gelu":
        return np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x])
    if act == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if act == "silu":
        return x / (1 + np.exp(-x))
    if act == "sigmoid":
        return 1 / (1 + np.exp(-x))
    return np.tanh(x)


@pytest.mark.parametrize("act", ACTS)
def test_activation_forward_and_grad(act):
    x = np.linspace(-6, 6, 97) + 0.013  # never exactly 0, where relu has a kink
    np.testing.assert_allclose(k.apply_activation(act, x), _reference_activation(act, x),
                               rtol=1e-12, atol=1e-14)
    eps = 1e-6
    numeric = (k.apply_activation(act, x + eps) - k.apply_activation(act, x - eps)) / (2 * eps)
    grad = np.linspace(0.5, 1.5, x.size)
    np.testing.assert_allclose(k.activation_grad(act, x, grad), numeric * grad,
                               rtol=1e-6, atol=1e-8)
    x32 = x.astype(np.float32)
    assert k.apply_activation(act, x32).dtype == np.float32
    assert k.activation_grad(act, x32, x32).dtype == np.float32


def test_sigmoid_family_does_not_overflow():
    x = np.array([-1000.0, 1000.0], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        np.testing.assert_array_equal(k.apply_activation("sigmoid", x), [0.0, 1.0])
        np.testing.assert_array_equal(k.apply_activation("silu", x), [0.0, 1000.0])


@needs_torch
def test_activations_match_torch():
    x = np.linspace(-5, 5, 41)
    np.testing.assert_allclose(k.apply_activation("gelu", x), F.gelu(t(x)).numpy(), atol=1e-15)
    np.testing.assert_allclose(k.apply_activation("gelu_tanh", x),
                               F.gelu(t(x), approximate="tanh").numpy(), atol=1e-15)
    np.testing.assert_allclose(k.apply_activation("silu", x), F.silu(t(x)).numpy(), atol=1e-15)


def test_unknown_activation_raises():
    with pytest.raises(ValueError, match="swish"):
        k.apply_activation("swish", np.zeros(2))
    with pytest.raises(ValueError, match="bias_act"):
        k.bias_act(np.zeros((2, 3)), None, "swish", 1)


@pytest.mark.parametrize("axis", [1, -1])
@pytest.mark.parametrize("act", ["gelu", "silu", "relu"])
def test_bias_act_forward_and_backward(act, axis):
    rng = np.random.default_rng(1)
    x = rand(rng, 2, 3, 4)
    bias = rand(rng, x.shape[axis])
    shape = [1, 1, 1]
    shape[axis] = bias.size
    np.testing.assert_allclose(k.bias_act(x, bias, act, axis),
                               _reference_activation(act, (x + bias.reshape(shape)).ravel())
                               .reshape(x.shape), rtol=1e-12, atol=1e-14)
    g = rand(rng, *x.shape)
    dx, db = k.bias_act_backward(g, x, bias, act, axis)

    def loss():
        return np.sum(k.bias_act(x, bias, act, axis) * g)

    assert_grad(dx, loss, x)
    assert_grad(db, loss, bias)
    dx_nobias, none = k.bias_act_backward(g, x, None, act, axis)
    assert none is None
    np.testing.assert_allclose(dx_nobias, k.activation_grad(act, x, g))


# ----- convolution ---------------------------------------------------------------------
def conv2d_naive(x, w, stride, padding, dilation, groups):
    n, c, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, cout, ho, wo))
    per_group = cout // groups
    for b, co, oh, ow in itertools.product(range(n), range(cout), range(ho), range(wo)):
        g = co // per_group
        for ci, i, j in itertools.product(range(cin_g), range(kh), range(kw)):
            out[b, co, oh, ow] += (xp[b, g * cin_g + ci, oh * sh + i * dh, ow * sw + j * dw]
                                   * w[co, ci, i, j])
    return out


CONV_CASES = [
    # x shape, w shape, stride, padding, dilation, groups
    ((2, 3, 6, 5), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((1, 4, 7, 8), (6, 2, 3, 2), (2, 1), (1, 0), (1, 2), 2),
    ((2, 4, 5, 5), (4, 1, 2, 3), (2, 2), (0, 1), (2, 1), 4),
    ((1, 2, 4, 4), (3, 2, 1, 1), (1, 1), (0, 0), (1, 1), 1),
]


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONV_CASES)
def test_conv2d_matches_naive_loops(xs, ws, stride, padding, dilation, groups):
    rng = np.random.default_rng(2)
    x, w = rand(rng, *xs), rand(rng, *ws)
    out = k.conv2d(x, w, stride, padding, dilation, groups)
    np.testing.assert_allclose(out, conv2d_naive(x, w, stride, padding, dilation, groups),
                               rtol=1e-12, atol=1e-12)
    assert out.flags.c_contiguous


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONV_CASES[:3])
def test_conv2d_grads_match_finite_differences(xs, ws, stride, padding, dilation, groups):
    rng = np.random.default_rng(3)
    x, w = rand(rng, *xs), rand(rng, *ws)
    g = rand(rng, *k.conv2d(x, w, stride, padding, dilation, groups).shape)

    def loss():
        return np.sum(k.conv2d(x, w, stride, padding, dilation, groups) * g)

    assert_grad(k.conv2d_grad_input(g, w, x.shape, stride, padding, dilation, groups), loss, x)
    assert_grad(k.conv2d_grad_weight(g, x, w.shape, stride, padding, dilation, groups), loss, w)


@st.composite
def conv_geometries(draw):
    groups = draw(st.integers(1, 3))
    cin_g, cout_g = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    n = draw(st.integers(1, 2))
    assume(h + 2 * ph >= dh * (kh - 1) + 1 and w + 2 * pw >= dw * (kw - 1) + 1)
    return ((n, groups * cin_g, h, w), (groups * cout_g, cin_g, kh, kw), (sh, sw), (ph, pw),
            (dh, dw), groups)


@needs_torch
@settings(deadline=None, max_examples=40)
@given(geometry=conv_geometries(), seed=st.integers(0, 2**16))
def test_conv2d_and_grads_match_torch(geometry, seed):
    xs, ws, stride, padding, dilation, groups = geometry
    rng = np.random.default_rng(seed)
    x, w = rand(rng, *xs), rand(rng, *ws)
    out = k.conv2d(x, w, stride, padding, dilation, groups)
    xt, wt = t(x, True), t(w, True)
    ref = F.conv2d(xt, wt, stride=stride, padding=padding, dilation=dilation, groups=groups)
    np.testing.assert_allclose(out, ref.detach().numpy(), rtol=1e-10, atol=1e-10)
    g = rand(rng, *out.shape)
    ref.backward(t(g))
    np.testing.assert_allclose(k.conv2d_grad_input(g, w, x.shape, stride, padding, dilation,
                                                   groups), xt.grad.numpy(), atol=1e-10)
    np.testing.assert_allclose(k.conv2d_grad_weight(g, x, w.shape, stride, padding, dilation,
                                                    groups), wt.grad.numpy(), atol=1e-10)


@needs_torch
def test_conv2d_grad_input_is_conv_transpose():
    rng = np.random.default_rng(4)
    x, w = rand(rng, 2, 4, 5, 6), rand(rng, 4, 3, 3, 3)  # transpose weight [Cin, Cout/g, kh, kw]
    stride, padding, output_padding = (2, 2), (1, 1), (1, 0)
    ref = F.conv_transpose2d(t(x), t(w), stride=stride, padding=padding,
                             output_padding=output_padding).numpy()
    out = k.conv2d_grad_input(x, w, ref.shape, stride, padding, (1, 1), 1)
    np.testing.assert_allclose(out, ref, atol=1e-12)


def test_conv2d_keeps_float32_and_rejects_bad_shapes():
    rng = np.random.default_rng(5)
    x = rand(rng, 1, 4, 6, 6).astype(np.float32)
    w = rand(rng, 4, 2, 3, 3).astype(np.float32)
    out = k.conv2d(x, w, (1, 1), (1, 1), (1, 1), 2)
    assert out.dtype == np.float32
    g = np.ones_like(out)
    assert k.conv2d_grad_input(g, w, x.shape, (1, 1), (1, 1), (1, 1), 2).dtype == np.float32
    assert k.conv2d_grad_weight(g, x, w.shape, (1, 1), (1, 1), (1, 1), 2).dtype == np.float32
    with pytest.raises(ValueError, match="conv2d.*groups=3"):
        k.conv2d(x, w, (1, 1), (1, 1), (1, 1), 3)
    with pytest.raises(ValueError, match="conv2d.*smaller than the dilated kernel"):
        k.conv2d(x, w, (1, 1), (0, 0), (4, 4), 2)
    with pytest.raises(ValueError, match="conv2d_grad_input: grad has shape"):
        k.conv2d_grad_input(g[:, :, 1:], w, x.shape, (1, 1), (1, 1), (1, 1), 2)


# ----- pooling -------------------------------------------------------------------------
def pool_naive(x, kernel, stride, padding, mode):
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    out, arg = np.zeros((n, c, ho, wo)), np.zeros((n, c, ho, wo), dtype=np.int64)
    for b, ch, oh, ow in itertools.product(range(n), range(c), range(ho), range(wo)):
        best, best_at, total = -np.inf, -1, 0.0
        for i, j in itertools.product(range(kh), range(kw)):
            r, q = oh * sh - ph + i, ow * sw - pw + j
            if 0 <= r < h and 0 <= q < w:
                total += x[b, ch, r, q]
                if x[b, ch, r, q] > best:
                    best, best_at = x[b, ch, r, q], r * w + q
        out[b, ch, oh, ow] = best if mode == "max" else total / (kh * kw)
        arg[b, ch, oh, ow] = best_at
    return out, arg


POOL_CASES = [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)), ((3, 2), (1, 2), (1, 0)),
              ((2, 3), (3, 1), (0, 1))]


@pytest.mark.parametrize("kernel, stride, padding", POOL_CASES)
def test_max_pool2d_forward_and_backward(kernel, stride, padding):
    rng = np.random.default_rng(6)
    x = rng.permutation(2 * 3 * 7 * 6).reshape(2, 3, 7, 6) / 10.0  # distinct values: no ties
    out, arg = k.max_pool2d(x, kernel, stride, padding)
    ref, ref_arg = pool_naive(x, kernel, stride, padding, "max")
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(arg, ref_arg)
    assert arg.dtype == np.int64
    g = rand(rng, *out.shape)
    assert_grad(k.max_pool2d_backward(g, arg, x.shape),
                lambda: np.sum(k.max_pool2d(x, kernel, stride, padding)[0] * g), x)


def test_max_pool2d_ties_pick_the_first_and_nan_propagates():
    x = np.zeros((1, 1, 2, 2))
    out, arg = k.max_pool2d(x, (2, 2), (1, 1), (0, 0))
    assert out[0, 0, 0, 0] == 0 and arg[0, 0, 0, 0] == 0
    x[0, 0, 1, 0] = np.nan
    out, arg = k.max_pool2d(x, (2, 2), (1, 1), (0, 0))
    assert np.isnan(out[0, 0, 0, 0]) and arg[0, 0, 0, 0] == 2
    x[0, 0, 1, 1] = np.nan  # like PyTorch, the last NaN of the window is reported
    assert k.max_pool2d(x, (2, 2), (1, 1), (0, 0))[1][0, 0, 0, 0] == 3
    # a window of only -inf reports its first position inside the image
    x = np.full((1, 1, 3, 3), -np.inf)
    out, arg = k.max_pool2d(x, (3, 3), (2, 2), (1, 1))
    np.testing.assert_array_equal(arg[0, 0], [[0, 1], [3, 4]])


def test_max_pool2d_backward_accumulates_overlapping_windows():
    x = np.zeros((1, 1, 3, 3))
    x[0, 0, 1, 1] = 5.0
    out, arg = k.max_pool2d(x, (2, 2), (1, 1), (0, 0))
    dx = k.max_pool2d_backward(np.ones_like(out), arg, x.shape)
    assert dx[0, 0, 1, 1] == 4.0 and dx.sum() == 4.0


@pytest.mark.parametrize("kernel, stride, padding", POOL_CASES)
def test_avg_pool2d_forward_and_backward(kernel, stride, padding):
    rng = np.random.default_rng(7)
    x = rand(rng, 2, 3, 7, 6)
    out = k.avg_pool2d(x, kernel, stride, padding)
    np.testing.assert_allclose(out, pool_naive(x, kernel, stride, padding, "avg")[0],
                               rtol=1e-12, atol=1e-14)
    g = rand(rng, *out.shape)
    assert_grad(k.avg_pool2d_backward(g, x.shape, kernel, stride, padding),
                lambda: np.sum(k.avg_pool2d(x, kernel, stride, padding) * g), x)


@needs_torch
@pytest.mark.parametrize("kernel, stride, padding", POOL_CASES)
def test_pools_match_torch(kernel, stride, padding):
    rng = np.random.default_rng(8)
    x = rand(rng, 2, 3, 9, 8)
    xt = t(x, True)
    ref, ref_arg = F.max_pool2d(xt, kernel, stride, padding, return_indices=True)
    out, arg = k.max_pool2d(x, kernel, stride, padding)
    np.testing.assert_array_equal(out, ref.detach().numpy())
    np.testing.assert_array_equal(arg, ref_arg.numpy())
    g = rand(rng, *out.shape)
    ref.backward(t(g))
    np.testing.assert_allclose(k.max_pool2d_backward(g, arg, x.shape), xt.grad.numpy())
    xt = t(x, True)
    ref = F.avg_pool2d(xt, kernel, stride, padding, count_include_pad=True)
    np.testing.assert_allclose(k.avg_pool2d(x, kernel, stride, padding), ref.detach().numpy(),
                               atol=1e-14)
    ref.backward(t(g))
    np.testing.assert_allclose(k.avg_pool2d_backward(g, x.shape, kernel, stride, padding),
                               xt.grad.numpy(), atol=1e-14)


def test_pool_float32_and_errors():
    x = np.arange(2 * 16, dtype=np.float32).reshape(1, 2, 4, 4)
    out, _ = k.max_pool2d(x, (2, 2), (2, 2), (0, 0))
    assert out.dtype == np.float32
    assert k.avg_pool2d(x, (2, 2), (2, 2), (0, 0)).dtype == np.float32
    assert k.avg_pool2d_backward(out, x.shape, (2, 2), (2, 2), (0, 0)).dtype == np.float32
    with pytest.raises(ValueError, match="max_pool2d: padding"):
        k.max_pool2d(x, (2, 2), (2, 2), (2, 2))
    with pytest.raises(ValueError, match="avg_pool2d: expected x"):
        k.avg_pool2d(x[0], (2, 2), (2, 2), (0, 0))


# ----- upsampling ----------------------------------------------------------------------
def nearest_naive(x, out_hw):
    h, w = x.shape[2:]
    rows = [min(int(math.floor(np.float32(d) * (np.float32(h) / np.float32(out_hw[0])))),
                h - 1) for d in range(out_hw[0])]
    cols = [min(int(math.floor(np.float32(d) * (np.float32(w) / np.float32(out_hw[1])))),
                w - 1) for d in range(out_hw[1])]
    out = np.zeros(x.shape[:2] + tuple(out_hw))
    for i, r in enumerate(rows):
        for j, q in enumerate(cols):
            out[:, :, i, j] = x[:, :, r, q]
    return out


def bilinear_naive(x, out_hw, align_corners):
    def source(d, size_in, size_out):
        if align_corners:
            return d * (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
        return max((d + 0.5) * size_in / size_out - 0.5, 0.0)

    h, w = x.shape[2:]
    out = np.zeros(x.shape[:2] + tuple(out_hw))
    for i, j in itertools.product(range(out_hw[0]), range(out_hw[1])):
        sy, sx = source(i, h, out_hw[0]), source(j, w, out_hw[1])
        y0, x0 = min(int(sy), h - 1), min(int(sx), w - 1)
        y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
        ly, lx = sy - y0, sx - x0
        out[:, :, i, j] = ((1 - ly) * ((1 - lx) * x[:, :, y0, x0] + lx * x[:, :, y0, x1])
                           + ly * ((1 - lx) * x[:, :, y1, x0] + lx * x[:, :, y1, x1]))
    return out


RESIZES = [((3, 4), (6, 8)), ((4, 5), (7, 3)), ((5, 5), (5, 5)), ((2, 3), (1, 1)),
           ((1, 1), (3, 2)), ((6, 7), (13, 9))]


@pytest.mark.parametrize("in_hw, out_hw", RESIZES)
def test_upsample_nearest2d_forward_and_backward(in_hw, out_hw):
    rng = np.random.default_rng(9)
    x = rand(rng, 2, 2, *in_hw)
    out = k.upsample_nearest2d(x, out_hw)
    np.testing.assert_array_equal(out, nearest_naive(x, out_hw))
    g = rand(rng, *out.shape)
    assert_grad(k.upsample_nearest2d_backward(g, x.shape),
                lambda: np.sum(k.upsample_nearest2d(x, out_hw) * g), x)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("in_hw, out_hw", RESIZES)
def test_upsample_bilinear2d_forward_and_backward(in_hw, out_hw, align_corners):
    rng = np.random.default_rng(10)
    x = rand(rng, 2, 2, *in_hw)
    out = k.upsample_bilinear2d(x, out_hw, align_corners)
    np.testing.assert_allclose(out, bilinear_naive(x, out_hw, align_corners), atol=1e-13)
    g = rand(rng, *out.shape)
    assert_grad(k.upsample_bilinear2d_backward(g, x.shape, align_corners),
                lambda: np.sum(k.upsample_bilinear2d(x, out_hw, align_corners) * g), x)


@needs_torch
def test_upsample_matches_torch_on_many_sizes():
    rng = np.random.default_rng(11)
    for h, ho in itertools.product(range(1, 12), range(1, 26)):
        x = rand(rng, 1, 2, h, 3)
        xt = t(x, True)
        ref = F.interpolate(xt, size=(ho, 5), mode="nearest")
        np.testing.assert_array_equal(k.upsample_nearest2d(x, (ho, 5)), ref.detach().numpy())
        g = rand(rng, *ref.shape)
        ref.backward(t(g))
        np.testing.assert_allclose(k.upsample_nearest2d_backward(g, x.shape), xt.grad.numpy(),
                                   atol=1e-13)
        for align in (False, True):
            xt = t(x, True)
            ref = F.interpolate(xt, size=(ho, 5), mode="bilinear", align_corners=align)
            np.testing.assert_allclose(k.upsample_bilinear2d(x, (ho, 5), align),
                                       ref.detach().numpy(), atol=1e-12)
            ref.backward(t(g))
            np.testing.assert_allclose(k.upsample_bilinear2d_backward(g, x.shape, align),
                                       xt.grad.numpy(), atol=1e-12)


@needs_torch
def test_upsample_nearest2d_rounds_like_torch_in_float32():
    # e.g. 21 -> 133 rows: float32 puts output row 95 on input row 14, not the exact 15
    for h, ho in itertools.product(range(1, 26), range(1, 140)):
        x = np.arange(h, dtype=np.float32).reshape(1, 1, h, 1)
        ref = F.interpolate(torch.from_numpy(x), size=(ho, 1), mode="nearest").numpy()
        np.testing.assert_array_equal(k.upsample_nearest2d(x, (ho, 1)), ref)


def test_upsample_keeps_float32():
    x = np.ones((1, 1, 3, 3), dtype=np.float32)
    assert k.upsample_nearest2d(x, (6, 6)).dtype == np.float32
    assert k.upsample_bilinear2d(x, (6, 5), False).dtype == np.float32
    g = np.ones((1, 1, 6, 6), dtype=np.float32)
    assert k.upsample_nearest2d_backward(g, x.shape).dtype == np.float32
    assert k.upsample_bilinear2d_backward(g, x.shape, True).dtype == np.float32
    np.testing.assert_allclose(k.upsample_bilinear2d_backward(g, x.shape, True).sum(), 36.0,
                               rtol=1e-6)


# ----- softmax family and cross-entropy -----------------------------------------------
def test_softmax_and_log_softmax_forward_and_backward():
    rng = np.random.default_rng(12)
    x = rand(rng, 3, 5) * 3
    ref = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    y, logy = k.softmax(x), k.log_softmax(x)
    np.testing.assert_allclose(y, ref, rtol=1e-13)
    np.testing.assert_allclose(logy, np.log(ref), rtol=1e-13)
    g = rand(rng, *x.shape)
    assert_grad(k.softmax_backward(g, y), lambda: np.sum(k.softmax(x) * g), x)
    assert_grad(k.log_softmax_backward(g, logy), lambda: np.sum(k.log_softmax(x) * g), x)


def test_softmax_is_stable_and_keeps_float32():
    x = np.array([[1000.0, 1000.0, -1000.0]], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise"):
        np.testing.assert_allclose(k.softmax(x), [[0.5, 0.5, 0.0]])
        np.testing.assert_allclose(k.log_softmax(x)[0, :2], [-math.log(2)] * 2, rtol=1e-6)
    assert k.softmax(x).dtype == np.float32 and k.log_softmax(x).dtype == np.float32


def cross_entropy_naive(logits, target, ignore_index, eps):
    n, c = logits.shape
    loss = np.zeros(n)
    for i in range(n):
        if target[i] == ignore_index:
            continue
        logp = logits[i] - logits[i].max()
        logp = logp - math.log(np.exp(logp).sum())
        loss[i] = -(1 - eps) * logp[target[i]] - eps / c * logp.sum()
    return loss


@pytest.mark.parametrize("ignore_index, eps", [(-100, 0.0), (2, 0.0), (-100, 0.1), (1, 0.3)])
def test_cross_entropy_forward_and_backward(ignore_index, eps):
    rng = np.random.default_rng(13)
    logits = rand(rng, 6, 4) * 2
    target = np.array([0, 2, 1, 3, 2, 1])
    if ignore_index == -100:
        target[3] = -100
    loss, logp = k.cross_entropy(logits, target, ignore_index, eps)
    np.testing.assert_allclose(loss, cross_entropy_naive(logits, target, ignore_index, eps),
                               rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(logp, k.log_softmax(logits))
    g = rand(rng, 6)
    assert_grad(k.cross_entropy_backward(g, logp, target, ignore_index, eps),
                lambda: np.sum(k.cross_entropy(logits, target, ignore_index, eps)[0] * g),
                logits)
    if torch is not None:
        ref = F.cross_entropy(t(logits), t(target), ignore_index=ignore_index,
                              label_smoothing=eps, reduction="none")
        np.testing.assert_allclose(loss, ref.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("ignore_index, eps", [(-100, 0.0), (2, 0.0), (-100, 0.1), (1, 0.3)])
def test_cross_entropy_reduced_forward_and_backward(reduction, ignore_index, eps):
    """The reduced loss against the naive per-row losses, its gradient against central
    differences, both against torch."""
    rng = np.random.default_rng(17)
    logits = rand(rng, 7, 4) * 2
    target = np.array([0, 2, 1, 3, 2, 1, 0])
    if ignore_index == -100:
        target[3] = -100
    rows = cross_entropy_naive(logits, target, ignore_index, eps)
    kept = np.sum(target != ignore_index)
    loss, logp, divisor = k.cross_entropy_reduced(logits, target, ignore_index, eps, reduction)
    assert loss.shape == () and divisor.shape == () and divisor.dtype == np.float64
    want = rows.sum() / (kept if reduction == "mean" else 1)
    np.testing.assert_allclose(loss, want, rtol=1e-12)
    g = np.array(1.7)
    assert_grad(k.cross_entropy_reduced_backward(g, logp, target, ignore_index, eps, divisor),
                lambda: float(k.cross_entropy_reduced(logits, target, ignore_index, eps, reduction)[0]) * 1.7,
                logits)
    if torch is not None:
        x = t(logits, grad=True)
        ref = F.cross_entropy(x, t(target), ignore_index=ignore_index, label_smoothing=eps, reduction=reduction)
        (ref * 1.7).backward()
        np.testing.assert_allclose(loss, ref.item(), rtol=1e-12)
        np.testing.assert_allclose(k.cross_entropy_reduced_backward(g, logp, target, ignore_index, eps, divisor),
                                   x.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_cross_entropy_reduced_every_row_ignored_and_errors():
    """A mean over no rows is NaN (as torch) and its gradient zero; bad arguments raise."""
    logits = np.ones((3, 2), dtype=np.float32)
    target = np.full(3, -100)
    loss, logp, divisor = k.cross_entropy_reduced(logits, target, -100, 0.0, "mean")
    assert np.isnan(loss) and loss.dtype == np.float32 and divisor == 0
    grad = k.cross_entropy_reduced_backward(np.array(1.0, np.float32), logp, target, -100, 0.0, divisor)
    assert grad.dtype == np.float32 and not grad.any()
    assert k.cross_entropy_reduced(logits, target, -100, 0.0, "sum")[0] == 0
    with pytest.raises(ValueError, match="cross_entropy_reduced: reduction"):
        k.cross_entropy_reduced(logits, target, -100, 0.0, "none")
    with pytest.raises(ValueError, match="cross_entropy_reduced_backward: grad must be 0-d"):
        k.cross_entropy_reduced_backward(np.ones(3, np.float32), logp, target, -100, 0.0, divisor)


def test_cross_entropy_float32_and_errors():
    logits = np.zeros((2, 3), dtype=np.float32)
    target = np.array([0, 1])
    loss, logp = k.cross_entropy(logits, target, -100, 0.1)
    assert loss.dtype == np.float32 and logp.dtype == np.float32
    assert k.cross_entropy_backward(np.ones(2), logp, target, -100, 0.1).dtype == np.float32
    with pytest.raises(ValueError, match="cross_entropy: expected logits"):
        k.cross_entropy(logits, np.array([0, 1, 2]), -100, 0.0)
    with pytest.raises(TypeError, match="integer class indices"):
        k.cross_entropy(logits, np.array([0.0, 1.0]), -100, 0.0)


# ----- normalisation -------------------------------------------------------------------
def normalize_naive(x, axes, eps):
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


@pytest.mark.parametrize("n_norm", [1, 2])
def test_layer_norm_forward_and_backward(n_norm):
    rng = np.random.default_rng(14)
    x = rand(rng, 3, 4, 5) * 2 + 1
    w, b = rand(rng, *x.shape[-n_norm:]), rand(rng, *x.shape[-n_norm:])
    y, mean, rstd = k.layer_norm(x, w, b, n_norm, 1e-5)
    axes = tuple(range(3 - n_norm, 3))
    np.testing.assert_allclose(y, normalize_naive(x, axes, 1e-5) * w + b, rtol=1e-12,
                               atol=1e-12)
    assert mean.shape == rstd.shape == (math.prod(x.shape[:-n_norm]),)
    g = rand(rng, *x.shape)
    dx, dw, db = k.layer_norm_backward(g, x, w, mean, rstd, n_norm)

    def loss():
        return np.sum(k.layer_norm(x, w, b, n_norm, 1e-5)[0] * g)

    assert_grad(dx, loss, x)
    assert_grad(dw, loss, w)
    assert_grad(db, loss, b)
    if torch is not None:
        ref = F.layer_norm(t(x), x.shape[-n_norm:], t(w), t(b), 1e-5)
        np.testing.assert_allclose(y, ref.numpy(), atol=1e-12)
    dx_plain, dw_plain, _ = k.layer_norm_backward(g, x, None, mean, rstd, n_norm)
    assert dw_plain is None
    assert_grad(dx_plain, lambda: np.sum(k.layer_norm(x, None, None, n_norm, 1e-5)[0] * g), x)


@pytest.mark.parametrize("act", ["none", "silu", "gelu"])
def test_group_norm_with_activation_forward_and_backward(act):
    rng = np.random.default_rng(15)
    x = rand(rng, 2, 6, 3, 2) * 2 + 0.5
    w, b = rand(rng, 6), rand(rng, 6)
    y, mean, rstd = k.group_norm(x, w, b, 3, 1e-5, act)
    assert mean.shape == rstd.shape == (2, 3)
    xg = x.reshape(2, 3, -1)
    pre = normalize_naive(xg, (2,), 1e-5).reshape(x.shape) * w[:, None, None] \
        + b[:, None, None]
    np.testing.assert_allclose(y, _reference_activation(act, pre.ravel()).reshape(x.shape),
                               rtol=1e-12, atol=1e-12)
    g = rand(rng, *x.shape)
    dx, dw, db = k.group_norm_backward(g, x, w, b, mean, rstd, 3, act)

    def loss():
        return np.sum(k.group_norm(x, w, b, 3, 1e-5, act)[0] * g)

    assert_grad(dx, loss, x)
    assert_grad(dw, loss, w)
    assert_grad(db, loss, b)
    if torch is not None:
        ref = F.group_norm(t(x), 3, t(w), t(b), 1e-5)
        ref = {"none": ref, "silu": F.silu(ref), "gelu": F.gelu(ref)}[act]
        np.testing.assert_allclose(y, ref.numpy(), atol=1e-12)
    _, dw_none, db_none = k.group_norm_backward(g, x, None, None, mean, rstd, 3, act)
    assert dw_none is None and db_none is None


def test_batch_norm_training_updates_running_stats():
    rng = np.random.default_rng(16)
    x = rand(rng, 4, 3, 2, 2) * 2 + 1
    w, b = rand(rng, 3), rand(rng, 3)
    run_mean, run_var = np.zeros(3), np.ones(3)
    y, mean, rstd = k.batch_norm(x, w, b, run_mean, run_var, True, 0.1, 1e-5)
    axes = (0, 2, 3)
    np.testing.assert_allclose(y, normalize_naive(x, axes, 1e-5) * w[:, None, None]
                               + b[:, None, None], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mean, x.mean(axis=axes))
    np.testing.assert_allclose(run_mean, 0.1 * x.mean(axis=axes))
    np.testing.assert_allclose(run_var, 0.9 + 0.1 * x.var(axis=axes, ddof=1))
    if torch is not None:
        rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
        ref = F.batch_norm(t(x), rm, rv, t(w), t(b), training=True, momentum=0.1, eps=1e-5)
        np.testing.assert_allclose(y, ref.numpy(), atol=1e-12)
        np.testing.assert_allclose(run_mean, rm.numpy(), atol=1e-14)
        np.testing.assert_allclose(run_var, rv.numpy(), atol=1e-14)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_backward(training):
    rng = np.random.default_rng(17)
    x = rand(rng, 3, 2, 2, 3) + 0.5
    w, b = rand(rng, 2), rand(rng, 2)
    run_mean, run_var = rand(rng, 2), rng.uniform(0.5, 2.0, 2)

    def forward():
        # fresh copies: training mode updates the running statistics in place
        return k.batch_norm(x, w, b, run_mean.copy(), run_var.copy(), training, 0.1, 1e-5)

    y, mean, rstd = forward()
    if not training:
        np.testing.assert_allclose(y, (x - run_mean[:, None, None])
                                   / np.sqrt(run_var[:, None, None] + 1e-5)
                                   * w[:, None, None] + b[:, None, None], atol=1e-12)
    g = rand(rng, *x.shape)
    dx, dw, db = k.batch_norm_backward(g, x, w, mean, rstd, training)

    def loss():
        return np.sum(forward()[0] * g)

    assert_grad(dx, loss, x)
    assert_grad(dw, loss, w)
    assert_grad(db, loss, b)


def test_norms_keep_float32_and_reject_bad_input():
    x = np.random.default_rng(18).standard_normal((2, 4, 3)).astype(np.float32)
    w = np.ones(4, dtype=np.float32)
    outs = k.layer_norm(x, None, None, 1, 1e-5) + k.group_norm(x, w, w, 2, 1e-5, "silu")
    rm, rv = np.zeros(4, dtype=np.float32), np.ones(4, dtype=np.float32)
    outs += k.batch_norm(x, w, w, rm, rv, True, 0.1, 1e-5)
    outs += k.batch_norm(x, w, w, rm, rv, False, 0.1, 1e-5)
    assert all(o.dtype == np.float32 for o in outs)
    assert rm.dtype == rv.dtype == np.float32
    grads = k.group_norm_backward(x, x, w, w, outs[4], outs[5], 2, "silu")
    assert all(gr.dtype == np.float32 for gr in grads)
    with pytest.raises(ValueError, match="group_norm.*3 channel groups"):
        k.group_norm(x, None, None, 3, 1e-5)
    with pytest.raises(ValueError, match="layer_norm: weight has shape"):
        k.layer_norm(x, w, None, 1, 1e-5)
    with pytest.raises(ValueError, match="batch_norm: training needs more than one value"):
        k.batch_norm(x[:1, :, :1], None, None, None, None, True, 0.1, 1e-5)
    with pytest.raises(ValueError, match="eval mode needs running"):
        k.batch_norm(x, None, None, None, None, False, 0.1, 1e-5)


# ----- attention and embedding ---------------------------------------------------------
def attention_naive(q, k_, v, mask, causal, scale):
    b, h, lq, _ = q.shape
    lk = k_.shape[2]
    out = np.zeros((b, h, lq, v.shape[3]))
    for bi, hi, i in itertools.product(range(b), range(h), range(lq)):
        scores = np.array([q[bi, hi, i] @ k_[bi, hi, j] * scale for j in range(lk)])
        if mask is not None:
            scores = scores + np.broadcast_to(mask, (b, h, lq, lk))[bi, hi, i]
        if causal:
            scores = np.where(np.arange(lk) > i, -np.inf, scores)
        p = np.exp(scores - scores.max())
        out[bi, hi, i] = (p / p.sum()) @ v[bi, hi]
    return out


@pytest.mark.parametrize("lq, lk", [(4, 4), (3, 5), (5, 3)])
@pytest.mark.parametrize("use_mask, causal", [(False, False), (True, False), (False, True),
                                              (True, True)])
def test_attention_forward_and_backward(lq, lk, use_mask, causal):
    rng = np.random.default_rng(19)
    q, k_, v = rand(rng, 2, 2, lq, 3), rand(rng, 2, 2, lk, 3), rand(rng, 2, 2, lk, 2)
    mask = None
    if use_mask:
        mask = np.where(rng.uniform(size=(1, 1, lq, lk)) < 0.3, -np.inf, 0.0)
        mask[..., 0] = 0.0  # every query keeps key 0, so no row is fully masked
    scale = 1 / math.sqrt(3)
    out, probs = k.attention(q, k_, v, mask, causal, scale)
    np.testing.assert_allclose(out, attention_naive(q, k_, v, mask, causal, scale),
                               rtol=1e-12, atol=1e-13)
    if torch is not None and not (use_mask and causal):  # torch takes one or the other
        ref = F.scaled_dot_product_attention(t(q), t(k_), t(v),
                                             attn_mask=None if mask is None else t(mask),
                                             is_causal=causal, scale=scale)
        np.testing.assert_allclose(out, ref.numpy(), atol=1e-12)
    g = rand(rng, *out.shape)
    dq, dk, dv = k.attention_backward(g, q, k_, v, probs, scale)

    def loss():
        return np.sum(k.attention(q, k_, v, mask, causal, scale)[0] * g)

    assert_grad(dq, loss, q)
    assert_grad(dk, loss, k_)
    assert_grad(dv, loss, v)


def test_attention_keeps_float32_with_float64_mask():
    q = np.ones((1, 1, 2, 4), dtype=np.float32)
    out, probs = k.attention(q, q, q, np.zeros((2, 2)), True, 0.5)
    assert out.dtype == probs.dtype == np.float32
    np.testing.assert_allclose(probs[0, 0], [[1, 0], [0.5, 0.5]])
    with pytest.raises(ValueError, match="attention: expected q"):
        k.attention(q, q[..., :3], q, None, False, 0.5)


def test_embedding_backward_accumulates_repeated_indices():
    rng = np.random.default_rng(20)
    idx = np.array([[1, 3, 1], [0, 1, 3]])
    g = rand(rng, 2, 3, 4).astype(np.float32)
    out = k.embedding_backward(g, idx, 5)
    ref = np.zeros((5, 4))
    for pos in np.ndindex(idx.shape):
        ref[idx[pos]] += g[pos]
    assert out.dtype == np.float32 and out.shape == (5, 4)
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    with pytest.raises(ValueError, match="embedding_backward"):
        k.embedding_backward(g, idx[:, :2], 5)


# ----- the same kernels on CuPy ---------------------------------------------------------
def run_every_kernel(kern, to) -> dict[str, np.ndarray]:
    """Call every kernel once on fixed float64 data moved with ``to``; the results come
    back as NumPy arrays keyed by name."""
    rng = np.random.default_rng(21)
    x, w = to(rand(rng, 2, 4, 7, 6)), to(rand(rng, 6, 2, 3, 3))
    geom = ((2, 1), (1, 1), (1, 2), 2)
    y = kern.conv2d(x, w, *geom)
    pooled, argmax = kern.max_pool2d(x, (3, 3), (2, 2), (1, 1))
    logits, target = to(rand(rng, 5, 4)), to(np.array([0, 3, -100, 1, 2]))
    loss, logp = kern.cross_entropy(logits, target, -100, 0.1)
    c4 = to(rand(rng, 4))
    gn, gmean, grstd = kern.group_norm(x, c4, c4, 2, 1e-5, "gelu")
    ln, lmean, lrstd = kern.layer_norm(x, None, None, 2, 1e-5)
    bn, bmean, brstd = kern.batch_norm(x, c4, c4, to(np.zeros(4)), to(np.ones(4)), True,
                                       0.1, 1e-5)
    q = to(rand(rng, 1, 2, 3, 4))
    att, probs = kern.attention(q, q, q, None, True, 0.5)
    nearest = kern.upsample_nearest2d(x, (13, 9))
    return {name: np.asarray(a.get() if hasattr(a, "get") else a) for name, a in {
        "conv": y,
        "conv_dx": kern.conv2d_grad_input(y, w, x.shape, *geom),
        "conv_dw": kern.conv2d_grad_weight(y, x, w.shape, *geom),
        "max_pool": pooled, "argmax": argmax,
        "max_pool_dx": kern.max_pool2d_backward(pooled, argmax, x.shape),
        "avg_pool": kern.avg_pool2d(x, (2, 2), (2, 2), (1, 0)),
        "avg_pool_dx": kern.avg_pool2d_backward(pooled, x.shape, (3, 3), (2, 2), (1, 1)),
        "nearest": nearest, "nearest_dx": kern.upsample_nearest2d_backward(nearest, x.shape),
        "bilinear": kern.upsample_bilinear2d(x, (5, 11), False),
        "bilinear_dx": kern.upsample_bilinear2d_backward(nearest, x.shape, True),
        "softmax": kern.softmax(x), "log_softmax_dx": kern.log_softmax_backward(x, x),
        "ce": loss, "ce_dx": kern.cross_entropy_backward(loss, logp, target, -100, 0.1),
        "group_norm": gn,
        "group_norm_dx": kern.group_norm_backward(x, x, c4, c4, gmean, grstd, 2, "gelu")[0],
        "layer_norm": ln,
        "layer_norm_dx": kern.layer_norm_backward(x, x, None, lmean, lrstd, 2)[0],
        "batch_norm": bn,
        "batch_norm_dx": kern.batch_norm_backward(x, x, c4, bmean, brstd, True)[0],
        "bias_act": kern.bias_act(x, c4, "silu", 1),
        "bias_act_db": kern.bias_act_backward(x, x, c4, "gelu_tanh", 1)[1],
        "attention": att, "attention_dq": kern.attention_backward(att, q, q, q, probs, 0.5)[0],
        "embedding_dx": kern.embedding_backward(to(rand(rng, 2, 3, 4)),
                                                to(np.array([[1, 0, 1], [4, 1, 0]])), 5),
    }.items()}


@pytest.mark.gpu
def test_every_kernel_runs_on_cupy_like_on_numpy():
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")

    class CupyK(NumpyNNKernels):
        xp = cp

    on_cpu = run_every_kernel(k, lambda a: a)
    on_gpu = run_every_kernel(CupyK(), cp.asarray)
    for name, expected in on_cpu.items():
        np.testing.assert_allclose(on_gpu[name], expected, rtol=1e-10, atol=1e-12,
                                   err_msg=name)
