"""The CuPy backend's RawKernels against the NumPy backend (float64 references).

Awkward sizes on purpose: odd widths, size-1 dims, rows longer than 1024 columns
(block-per-row paths), widths that are not a multiple of the 16-byte pack.  Also:
a cuBLAS GEMM and a RawKernel captured in a CUDA graph and replayed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

from tensorcore.backends.cupy import elementwise as ew, linalg, nn  # noqa: E402
from tensorcore.backends.cupy.backend import CupyBackend  # noqa: E402
from tensorcore.backends.numpy.backend import NumpyBackend  # noqa: E402
from gpu_check import ACTS, RNG, as_float32, check, on_gpu, rand  # noqa: E402
from norm_bounds import layer_norm_atols  # noqa: E402

GPU, REF = CupyBackend(), NumpyBackend()
STORAGE_DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]


# ----- elementwise ------------------------------------------------------------------
@pytest.mark.parametrize("op", ["neg", "abs", "sign", "exp", "log1p", "sqrt", "rsqrt", "sin",
                                "cos", "tanh", "sigmoid", "relu", "erf", "gelu", "gelu_tanh",
                                "silu", "softplus", "floor", "ceil", "round"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary(op, dtype):
    x = rand(3, 1, 517)
    if op in ("log1p", "sqrt", "rsqrt"):
        x = np.abs(x) + 0.1
    check(GPU.unary(op, on_gpu(x, dtype)), REF.unary(op, x), dtype)


def test_unary_half_and_unaligned_view():
    x = rand(1001)
    check(GPU.unary("silu", on_gpu(x, np.float16)), REF.unary("silu", x.astype(np.float16)),
          np.float16)
    g = on_gpu(x)[1:]  # 4-byte offset: not 16-byte aligned, scalar path
    check(GPU.unary("exp", g), np.exp(x[1:]))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum", "pow"])
@pytest.mark.parametrize("shapes", [((7, 33), (7, 33)), ((7, 33), (1,)), ((), (5, 3)),
                                    ((4, 1, 5), (1, 3, 5)), ((2, 3, 1, 6, 1), (3, 5, 6, 7))])
def test_binary_broadcast(op, shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1])
    if op == "pow":
        a = np.abs(a) + 0.5
    check(GPU.binary(op, on_gpu(a), on_gpu(b)), REF.binary(op, a, b))


def launched(monkeypatch, module) -> list[str]:
    """The names of the kernels ``module`` launches from now on (to check which path ran)."""
    names: list[str] = []
    real = module.launch

    def record(filename, name, *args, **kwargs):
        names.append(name)
        return real(filename, name, *args, **kwargs)

    monkeypatch.setattr(module, "launch", record)
    return names


# A tensor with an operand holding one value per channel of [outer, C, inner]: packs when
# inner is a whole number of packs ([N, C, H, W] + [N, C, 1, 1] or [1, C, 1, 1]), elements
# otherwise (inner 9; [rows, D] + [D] has inner 1); either operand may be the tensor.
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum", "pow"])
@pytest.mark.parametrize("shapes", [((2, 5, 8, 8), (2, 5, 1, 1)), ((2, 5, 8, 8), (1, 5, 1, 1)),
                                    ((5, 1, 1), (3, 5, 4, 4)), ((2, 5, 3, 3), (5, 1, 1)),
                                    ((6, 12), (12,)), ((4,), (3, 4))])
@pytest.mark.parametrize("dtype", STORAGE_DTYPES)
def test_binary_per_channel(monkeypatch, op, shapes, dtype):
    a, b = rand(*shapes[0]), rand(*shapes[1])
    if op == "pow":
        a = np.abs(a) + 0.5
    as_stored = (lambda v: v.astype(dtype).astype(np.float64))
    names = launched(monkeypatch, ew)
    got = GPU.binary(op, on_gpu(a, dtype), on_gpu(b, dtype))
    assert names == ["binary_channel_kernel"]
    want = REF.binary(op, as_stored(a), as_stored(b))
    check(got, want, dtype if dtype in (np.float32, np.float64) else np.float16)


def test_binary_per_channel_odd_layouts(monkeypatch):
    x, v = rand(2, 5, 8, 9), rand(2, 5, 1, 1)
    names = launched(monkeypatch, ew)
    strided = on_gpu(x)[:, :, :, 1:]  # not contiguous: the general broadcast kernel
    check(GPU.binary("sub", strided, on_gpu(v)), x[:, :, :, 1:] - v)
    assert names == ["binary_bcast_kernel"]
    rows, r = x.reshape(-1)[1:713].reshape(89, 8), rand(89, 1)
    shifted = on_gpu(x.reshape(-1))[1:713].reshape(89, 8)  # 4-byte offset: no packs
    check(GPU.binary("mul", shifted, on_gpu(r)), rows * r)
    assert names[-1] == "binary_channel_kernel"


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape, axis", [((2, 5, 3, 3), 1), ((3, 1027), -1), ((8, 16, 4), 1)])
def test_bias_act_and_backward(act, shape, axis):
    x, g = rand(*shape), rand(*shape)
    bias = rand(shape[axis])
    check(GPU.bias_act(on_gpu(x), on_gpu(bias), act, axis), REF.bias_act(x, bias, act, axis))
    dx, db = GPU.bias_act_backward(on_gpu(g), on_gpu(x), on_gpu(bias), act, axis)
    rdx, rdb = REF.bias_act_backward(g, x, bias, act, axis)
    check(dx, rdx)
    check(db, rdb)
    check(GPU.activation_grad(act, on_gpu(x), on_gpu(g)), REF.activation_grad(act, x, g))


def test_affine_act():
    x, a, b = rand(2, 6, 5, 8), rand(6), rand(6)
    want = REF.bias_act(x * a.reshape(1, 6, 1, 1), b, "silu", 1)
    check(GPU.affine_act(on_gpu(x), on_gpu(a), on_gpu(b), "silu", 1), want)


# ----- reductions -------------------------------------------------------------------
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("shape, axes", [((5, 3000), (1,)), ((300, 7), (0,)), ((4, 6, 33), (0, 2)),
                                         ((1, 70001), None), ((3, 1, 5), (1,)), ((2, 3, 4), (0, 1)),
                                         ((9, 5, 2, 3), (1, 3))])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce(op, shape, axes, keepdims):
    x = rand(*shape)
    got = GPU.reduce(op, on_gpu(x, np.float64), axes, keepdims)
    want = REF.reduce(op, x, axes, keepdims)
    assert got.shape == want.shape
    check(got, want, np.float64)


def test_reduce_half_accumulates_in_float():
    x = np.abs(rand(4, 5000)).astype(np.float16)
    check(GPU.reduce("sum", cp.asarray(x), (1,), False), x.astype(np.float64).sum(1), np.float16)


# ----- softmax family ---------------------------------------------------------------
@pytest.mark.parametrize("cols", [1, 7, 32, 1024, 1025, 3001])
def test_softmax_family(cols):
    x, g = rand(5, cols, scale=3.0), rand(5, cols)
    for fwd, bwd in (("softmax", "softmax_backward"), ("log_softmax", "log_softmax_backward")):
        y = getattr(GPU, fwd)(on_gpu(x))
        ry = getattr(REF, fwd)(x)
        check(y, ry)
        check(getattr(GPU, bwd)(on_gpu(g), y), getattr(REF, bwd)(g, ry))


@pytest.mark.parametrize("cols", [3, 1500])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy(cols, smoothing):
    n = 9
    x, target = rand(n, cols, scale=2.0), RNG.integers(0, cols, n)
    target[2] = -100
    gr = rand(n)
    loss, logp = GPU.cross_entropy(on_gpu(x), cp.asarray(target), -100, smoothing)
    rloss, rlogp = REF.cross_entropy(x, target, -100, smoothing)
    check(loss, rloss)
    check(logp, rlogp)
    got = GPU.cross_entropy_backward(on_gpu(gr), logp, cp.asarray(target), -100, smoothing)
    check(got, REF.cross_entropy_backward(gr, rlogp, target, -100, smoothing))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_attention(causal, with_mask):
    q, k, v = rand(2, 3, 5, 8), rand(2, 3, 7, 8), rand(2, 3, 7, 6)
    mask = np.where(RNG.random((1, 1, 5, 7)) < 0.2, -np.inf, 0.0) if with_mask else None
    if mask is not None:
        mask[..., 0] = 0.0  # every row keeps one key
    out, probs = GPU.attention(on_gpu(q), on_gpu(k), on_gpu(v),
                               None if mask is None else on_gpu(mask), causal, 0.3)
    rout, rprobs = REF.attention(q, k, v, mask, causal, 0.3)
    check(out, rout)
    check(probs, rprobs)
    g = rand(*rout.shape)
    for got, want in zip(GPU.attention_backward(on_gpu(g), on_gpu(q), on_gpu(k), on_gpu(v),
                                                probs, 0.3),
                         REF.attention_backward(g, q, k, v, rprobs, 0.3)):
        check(got, want)


# ----- normalisation ----------------------------------------------------------------
@pytest.mark.parametrize("shape, n_norm", [((6, 33), 1), ((3, 2, 1500), 1), ((4, 3, 5), 2),
                                           ((1, 1), 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(shape, n_norm, affine):
    x, g = as_float32(rand(*shape, scale=2.0) + 1.0), as_float32(rand(*shape))
    w = as_float32(rand(*shape[-n_norm:])) if affine else None
    b = as_float32(rand(*shape[-n_norm:])) if affine else None
    opt = (lambda a: None if a is None else on_gpu(a))
    y, mean, rstd = GPU.layer_norm(on_gpu(x), opt(w), opt(b), n_norm, 1e-5)
    ry, rmean, rrstd = REF.layer_norm(x, w, b, n_norm, 1e-5)
    check(y, ry)
    check(mean, rmean)
    check(rstd, rrstd)
    got = GPU.layer_norm_backward(on_gpu(g), on_gpu(x), opt(w), mean, rstd, n_norm)
    want = REF.layer_norm_backward(g, x, w, rmean, rrstd, n_norm)
    atols = layer_norm_atols(x, g, w, rmean, rrstd, n_norm)  # float32 bounds, norm_bounds.py
    for a, b_, atol in zip(got, want, atols):
        assert (a is None) == (b_ is None)
        if a is not None:
            check(a, b_, atol=atol)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(4, 3, 5, 7), (6, 5), (3, 2, 33, 1), (8, 16, 8, 8),
                                   (2, 3, 64, 96)])
def test_batch_norm(training, shape):
    x, g = rand(*shape) + 1.0, rand(*shape)
    c = shape[1]
    w, b = rand(c), rand(c)
    rm, rv = rand(c), np.abs(rand(c)) + 0.5
    grm, grv = on_gpu(rm), on_gpu(rv)
    y, mean, rstd = GPU.batch_norm(on_gpu(x), on_gpu(w), on_gpu(b), grm, grv, training, 0.1, 1e-5)
    ry, rmean, rrstd = REF.batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5)
    check(y, ry)
    check(mean, rmean)
    check(rstd, rrstd)
    check(grm, rm)
    check(grv, rv)
    got = GPU.batch_norm_backward(on_gpu(g), on_gpu(x), on_gpu(w), mean, rstd, training)
    for a, b_ in zip(got, REF.batch_norm_backward(g, x, w, rmean, rrstd, training)):
        check(a, b_)


# ----- convolution (im2col + GEMM) ----------------------------------------------------
@pytest.mark.parametrize("geom", [
    ((2, 3, 9, 7), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((1, 4, 10, 11), (6, 2, 3, 2), (2, 1), (1, 0), (1, 2), 2),
    ((3, 5, 6, 6), (7, 5, 1, 1), (1, 1), (0, 0), (1, 1), 1),
    ((2, 4, 8, 8), (4, 1, 3, 3), (2, 2), (1, 1), (1, 1), 4),
])
def test_conv2d_and_grads(geom):
    xs, ws, stride, padding, dilation, groups = geom
    x, w = rand(*xs), rand(*ws)
    y = GPU.conv2d(on_gpu(x), on_gpu(w), stride, padding, dilation, groups)
    ry = REF.conv2d(x, w, stride, padding, dilation, groups)
    check(y, ry)
    g = rand(*ry.shape)
    check(GPU.conv2d_grad_input(on_gpu(g), on_gpu(w), xs, stride, padding, dilation, groups),
          REF.conv2d_grad_input(g, w, xs, stride, padding, dilation, groups))
    check(GPU.conv2d_grad_weight(on_gpu(g), on_gpu(x), ws, stride, padding, dilation, groups),
          REF.conv2d_grad_weight(g, x, ws, stride, padding, dilation, groups))


# ----- pooling and resampling -------------------------------------------------------
@pytest.mark.parametrize("kernel, stride, padding", [((2, 2), (2, 2), (0, 0)),
                                                     ((3, 3), (2, 1), (1, 1)),
                                                     ((3, 2), (1, 2), (1, 0))])
def test_pooling(kernel, stride, padding):
    x = rand(2, 3, 9, 8)
    y, arg = GPU.max_pool2d(on_gpu(x), kernel, stride, padding)
    ry, rarg = REF.max_pool2d(x, kernel, stride, padding)
    check(y, ry)
    np.testing.assert_array_equal(cp.asnumpy(arg), rarg)
    g = rand(*ry.shape)
    check(GPU.max_pool2d_backward(on_gpu(g), arg, x.shape),
          REF.max_pool2d_backward(g, rarg, x.shape))
    check(GPU.avg_pool2d(on_gpu(x), kernel, stride, padding),
          REF.avg_pool2d(x, kernel, stride, padding))
    check(GPU.avg_pool2d_backward(on_gpu(g), x.shape, kernel, stride, padding),
          REF.avg_pool2d_backward(g, x.shape, kernel, stride, padding))


# 2x2 windows at stride 2 over widths that are multiples of 4 take the paired kernel (odd
# heights drop the last row); ties and NaNs check which tap wins.
@pytest.mark.parametrize("dtype", STORAGE_DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 9, 16), (1, 2, 4, 32), (3, 1, 6, 4), (1, 5, 2, 12)])
def test_max_pool_2x2_packed(monkeypatch, dtype, shape):
    x = RNG.integers(-3, 3, size=shape).astype(np.float64)  # few values: many ties
    x.reshape(-1)[::7] = np.nan
    x.reshape(-1)[::11] = -np.inf
    names = launched(monkeypatch, nn)
    y, arg = GPU.max_pool2d(on_gpu(x, dtype), (2, 2), (2, 2), (0, 0))
    assert names == ["max_pool_2x2_kernel"]
    ry, rarg = REF.max_pool2d(x, (2, 2), (2, 2), (0, 0))
    np.testing.assert_array_equal(cp.asnumpy(y).astype(np.float64), ry)
    np.testing.assert_array_equal(cp.asnumpy(arg), rarg)


def test_max_pool_2x2_other_widths_take_the_general_kernel(monkeypatch):
    x = rand(2, 3, 6, 10)  # 10 is not a multiple of 4
    names = launched(monkeypatch, nn)
    y, arg = GPU.max_pool2d(on_gpu(x), (2, 2), (2, 2), (0, 0))
    assert names == ["max_pool_fwd_kernel"]
    ry, rarg = REF.max_pool2d(x, (2, 2), (2, 2), (0, 0))
    check(y, ry)
    np.testing.assert_array_equal(cp.asnumpy(arg), rarg)


# Power-of-two row factors with column factors 1 or 2 over whole packs take the packed
# kernel; other factors (3) and part packs the general one.
@pytest.mark.parametrize("dtype", STORAGE_DTYPES)
@pytest.mark.parametrize("in_hw, out_hw, packed", [((4, 16), (8, 32), True),
                                                   ((5, 16), (20, 16), True),
                                                   ((3, 16), (3, 32), True),
                                                   ((3, 16), (9, 32), False),
                                                   ((4, 5), (8, 10), False)])
def test_upsample_nearest_packed(monkeypatch, dtype, in_hw, out_hw, packed):
    x = rand(2, 3, *in_hw)
    names = launched(monkeypatch, nn)
    y = GPU.upsample_nearest2d(on_gpu(x, dtype), out_hw)
    assert names == ["nearest_up_packs_kernel" if packed else "nearest_fwd_kernel"]
    want = REF.upsample_nearest2d(x.astype(dtype).astype(np.float64), out_hw)
    np.testing.assert_array_equal(cp.asnumpy(y).astype(np.float64), want)


@pytest.mark.parametrize("in_hw, out_hw", [((4, 5), (8, 10)), ((21, 7), (133, 3)), ((1, 3), (4, 4))])
@pytest.mark.parametrize("align", [False, True])
def test_upsample(in_hw, out_hw, align):
    x = rand(2, 3, *in_hw)
    g = rand(2, 3, *out_hw)
    check(GPU.upsample_nearest2d(on_gpu(x), out_hw), REF.upsample_nearest2d(x, out_hw))
    check(GPU.upsample_nearest2d_backward(on_gpu(g), x.shape),
          REF.upsample_nearest2d_backward(g, x.shape))
    check(GPU.upsample_bilinear2d(on_gpu(x), out_hw, align),
          REF.upsample_bilinear2d(x, out_hw, align))
    check(GPU.upsample_bilinear2d_backward(on_gpu(g), x.shape, align),
          REF.upsample_bilinear2d_backward(g, x.shape, align))


def test_embedding_backward():
    idx = RNG.integers(0, 11, (4, 33))
    g = rand(4, 33, 19)
    check(GPU.embedding_backward(on_gpu(g), cp.asarray(idx), 11), REF.embedding_backward(g, idx, 11))


# ----- matmul ----------------------------------------------------------------------------
@pytest.mark.parametrize("sa, sb", [((33, 17), (17, 5)), ((3, 1, 7, 4), (2, 4, 9)), ((5,), (5, 3)),
                                    ((4, 6), (6,)), ((2, 1, 3), (2, 3, 1025))])
def test_matmul(sa, sb):
    a, b = rand(*sa), rand(*sb)
    check(GPU.matmul(on_gpu(a, np.float64), on_gpu(b, np.float64)), REF.matmul(a, b), np.float64)
    check(GPU.matmul(on_gpu(a), on_gpu(b)), REF.matmul(a, b))


def test_matmul_transposed_views_and_half():
    a, b = rand(40, 24), rand(56, 40)
    got = GPU.matmul(on_gpu(a).T, on_gpu(b).T)  # both stored transposed: no copy
    check(got, a.T @ b.T)
    h = GPU.matmul(on_gpu(a, np.float16).T, on_gpu(b, np.float16).T)
    assert h.dtype == np.float16
    check(h, a.astype(np.float16).astype(np.float64).T @ b.astype(np.float16).astype(np.float64).T,
          np.float16)


# A product of at most 8 rows with a weight's transpose (a Linear on a few rows) is one
# kernel with the bias and activation fused; the fused call equals matmul then bias_act
# exactly (the product is rounded to the dtype before the bias either way).  9 rows and a
# weight not stored transposed take cuBLAS.
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("rows, k, n, few", [(1, 512, 384, True), (3, 8, 5, True),
                                             (8, 64, 1, True), (9, 16, 7, False)])
def test_few_rows_times_a_weight(monkeypatch, dtype, rows, k, n, few):
    a, w, bias = rand(rows, k), rand(n, k), rand(n)
    ga, gw, gb = on_gpu(a, dtype), on_gpu(w, dtype), on_gpu(bias, dtype)
    names: list[str] = []
    real = linalg.kernel
    monkeypatch.setattr(linalg, "kernel", lambda f, name, dt: names.append(name) or real(f, name, dt))
    y = GPU.matmul(ga, gw.T)
    assert ("linear_rows_kernel" in names) == few
    exact = [cp.asnumpy(t).astype(np.float64) for t in (ga, gw)]
    check(y, exact[0] @ exact[1].T, dtype)
    fused = GPU.matmul_bias_act(ga, gw.T, gb, "silu")
    np.testing.assert_array_equal(cp.asnumpy(fused), cp.asnumpy(GPU.bias_act(y, gb, "silu", -1)))
    if n > 1:  # (a single column is stored both ways)
        names.clear()
        GPU.matmul(ga, cp.ascontiguousarray(gw.T))  # the same product, b stored row-major
        assert "linear_rows_kernel" not in names


# Products of one input run together (the compiled UNet's time-embedding projections):
# one launch per 32 of those the few-rows kernel takes, each result equal to its own
# call's; a product the kernel does not take (b stored row-major) runs on its own.
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("rows, count", [(1, 3), (2, 35)])
def test_grouped_products_of_one_input(monkeypatch, dtype, rows, count):
    k = 64
    a = on_gpu(rand(rows, k), dtype)
    products = []
    for i in range(count):
        n = 1 + (i * 37) % 300
        w = on_gpu(rand(n, k), dtype)
        products.append((w.T, None if i % 3 == 1 else on_gpu(rand(n), dtype), ACTS[i % len(ACTS)]))
    products[1] = (cp.ascontiguousarray(products[1][0]), *products[1][1:])
    names: list[str] = []
    real = linalg.kernel
    monkeypatch.setattr(linalg, "kernel", lambda f, name, dt: names.append(name) or real(f, name, dt))
    got = GPU.matmul_bias_act_group(a, tuple(products))
    assert names.count("linear_rows_group_kernel") == -(-(count - 1) // linalg.GROUP_MAX)
    assert "linear_rows_kernel" not in names
    for g, (b, bias, act) in zip(got, products):
        assert g.dtype == a.dtype
        want = GPU.matmul_bias_act(a, b, bias, act)
        np.testing.assert_array_equal(as_float32(cp.asnumpy(g)), as_float32(cp.asnumpy(want)))


def test_grouped_products_keep_their_strided_bias_copies_until_the_launch():
    """Each strided bias is copied; a copy freed before the launch could be handed to
    the next bias copy or to a result of the same launch."""
    a = on_gpu(rand(2, 64))
    products = tuple((on_gpu(rand(n, 64)).T, on_gpu(rand(2 * n))[::2], "silu") for n in (96,) * 8)
    got = GPU.matmul_bias_act_group(a, products)
    for g, p in zip(got, products):
        np.testing.assert_array_equal(cp.asnumpy(g), cp.asnumpy(GPU.matmul_bias_act(a, *p)))


def test_grouped_products_replay_in_a_cuda_graph():
    a = on_gpu(rand(1, 32))
    products = tuple((on_gpu(rand(n, 32)).T, on_gpu(rand(n)), "silu") for n in (16, 40, 8))
    # the inputs were copied on the default stream, which a non-blocking stream does not wait for
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        want = GPU.matmul_bias_act_group(a, products)  # warm: compiled, pool ready
        stream.synchronize()
        stream.begin_capture()
        got = GPU.matmul_bias_act_group(a, products)
        graph = stream.end_capture()
        for y in got:
            y.fill(0)
        graph.launch(stream)
        stream.synchronize()
    for g, w in zip(got, want):
        np.testing.assert_array_equal(cp.asnumpy(g), cp.asnumpy(w))


# ----- RNG -----------------------------------------------------------------------------
def test_rng_moments_and_advance():
    gen = GPU.rng(123)
    u1 = cp.asnumpy(GPU.uniform(gen, (1001, 999), -1.0, 3.0, np.float32))
    u2 = cp.asnumpy(GPU.uniform(gen, (1001, 999), -1.0, 3.0, np.float32))
    assert u1.min() >= -1.0 and u1.max() < 3.0 and abs(u1.mean() - 1.0) < 0.01
    assert not np.array_equal(u1, u2)
    z = cp.asnumpy(GPU.normal(GPU.rng(7), (2_000_001,), 2.0, 0.5, np.float64))
    assert abs(z.mean() - 2.0) < 2e-3 and abs(z.std() - 0.5) < 2e-3
    assert np.array_equal(z, cp.asnumpy(GPU.normal(GPU.rng(7), (2_000_001,), 2.0, 0.5, np.float64)))
    i = cp.asnumpy(GPU.integers(GPU.rng(1), (10_000,), -3, 4, np.int32))
    assert i.dtype == np.int32 and set(np.unique(i)) == set(range(-3, 4))


# ----- CUDA graph capture of cuBLAS GEMM + RawKernels --------------------------------------
def test_graph_capture_gemm_and_rawkernel_replays():
    a, b = on_gpu(rand(129, 65)), on_gpu(rand(65, 257))
    bias = on_gpu(rand(257))
    gen = GPU.rng(5)
    # the inputs were copied on the default stream, which a non-blocking stream does not wait for
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        GPU.bias_act(GPU.matmul(a, b), bias, "silu", 1)  # warm: compile, handle, pool
        GPU.uniform(gen, (16,), 0.0, 1.0, np.float32)
        stream.synchronize()
        stream.begin_capture()
        y = GPU.bias_act(GPU.matmul(a, b), bias, "silu", 1)
        noise = GPU.uniform(gen, (16,), 0.0, 1.0, np.float32)
        graph = stream.end_capture()
        draws = []
        for _ in range(2):
            a[...] = on_gpu(rand(129, 65))
            graph.launch(stream)
            stream.synchronize()
            want = REF.bias_act(cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b), cp.asnumpy(bias),
                                "silu", 1)
            check(y, want)
            draws.append(cp.asnumpy(noise).copy())
    assert not np.array_equal(draws[0], draws[1])  # RNG advances on every replay


def test_memory_helpers():
    from tensorcore import cuda

    assert cuda.is_available()
    cuda.empty_cache()  # the backend's kept buffers (convolution scratch) go too: start without them
    before = cuda.memory_allocated()
    x = cp.empty(1 << 20, dtype=np.float32)
    assert cuda.memory_allocated() >= before + x.nbytes
    del x
    cuda.empty_cache()
    assert cuda.memory_allocated() == before


def test_empty_cache_frees_the_buffers_the_backend_keeps():
    from tensorcore import cuda
    from tensorcore.backends import backend_for

    gpu = backend_for("cuda")
    x = on_gpu(rand(2, 8, 5, 3))  # odd planes: the two-pass kernels and their counters
    before = gpu.group_norm(x, None, None, 4, 1e-5)[0]
    assert gpu.buffers._buffers
    cuda.empty_cache()
    assert not gpu.buffers._buffers
    np.testing.assert_array_equal(cp.asnumpy(gpu.group_norm(x, None, None, 4, 1e-5)[0]),
                                  cp.asnumpy(before))  # made again on demand
