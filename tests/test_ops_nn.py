"""Neural-network ops (``tensorcore.functional``): convolution, pooling, upsampling,
normalisation, softmax family, losses, dropout, embedding, attention, bias + activation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import nn_reference as ref
import tensorcore as tc
import tensorcore.functional as F
from op_harness import check_op, load_torch, shapes

torch = load_torch()
TF = torch.nn.functional if torch else None
pairs = st.tuples


# ----- convolution -----------------------------------------------------------------------
@st.composite
def conv_geometry(draw, transposed=False):
    """(x shape, w shape, stride, padding, dilation, groups[, output_padding]) that fit."""
    groups = draw(st.integers(1, 2))
    cin, cout = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
    kernel = draw(pairs(st.integers(1, 3), st.integers(1, 3)))
    stride, dilation = draw(pairs(st.integers(1, 2), st.integers(1, 2))), draw(pairs(st.integers(1, 2), st.integers(1, 2)))
    padding = draw(pairs(st.integers(0, 2), st.integers(0, 2)))
    span = [d * (k - 1) + 1 for d, k in zip(dilation, kernel)]
    if transposed:  # padding may not exceed the kernel span, output padding < stride or dilation
        padding = tuple(min(p, (s - 1) // 2) for p, s in zip(padding, span))
        hw = draw(pairs(st.integers(1, 4), st.integers(1, 4)))
        output_padding = tuple(draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation))
        x = (draw(st.integers(1, 2)), cin) + hw
        return x, (cin, cout // groups) + kernel, stride, padding, dilation, groups, output_padding
    hw = tuple(draw(st.integers(max(1, s - 2 * p), max(1, s - 2 * p) + 3)) for s, p in zip(span, padding))
    return (draw(st.integers(1, 2)), cin) + hw, (cout, cin // groups) + kernel, stride, padding, dilation, groups


@given(data=st.data(), with_bias=st.booleans())
def test_conv2d(backend, data, with_bias):
    x, w, stride, padding, dilation, groups = data.draw(conv_geometry())
    inputs = [x, w] + ([(w[0],)] if with_bias else [])

    def op(x, w, b=None):
        return F.conv2d(x, w, b, stride, padding, dilation, groups)

    def reference(x, w, b=None):
        return ref.conv2d(x, w, b, stride, padding, dilation, groups)

    def torch_op(x, w, b=None):
        return TF.conv2d(x, w, b, stride, padding, dilation, groups)
    check_op(backend, data, op, reference, inputs, torch_op=torch_op)


@given(data=st.data())
def test_conv2d_same_padding(backend, data):
    kernel = data.draw(st.sampled_from([1, 3, 5]))
    shape = (1, 2) + data.draw(pairs(st.integers(1, 5), st.integers(1, 5)))
    pad = kernel // 2
    check_op(backend, data, lambda x, w: F.conv2d(x, w, padding="same"),
             lambda x, w: ref.conv2d(x, w, padding=(pad, pad)), [shape, (3, 2, kernel, kernel)],
             torch_op=lambda x, w: TF.conv2d(x, w, padding="same"))


@given(data=st.data(), with_bias=st.booleans())
def test_conv_transpose2d(backend, data, with_bias):
    x, w, stride, padding, dilation, groups, output_padding = data.draw(conv_geometry(transposed=True))
    inputs = [x, w] + ([(w[1] * groups,)] if with_bias else [])

    def op(x, w, b=None):
        return F.conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation)

    def reference(x, w, b=None):
        return ref.conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation)

    def torch_op(x, w, b=None):
        return TF.conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation)
    check_op(backend, data, op, reference, inputs, torch_op=torch_op)


# ----- pooling and upsampling --------------------------------------------------------------
@st.composite
def pool_geometry(draw):
    kernel = draw(pairs(st.integers(1, 3), st.integers(1, 3)))
    stride = draw(st.none() | pairs(st.integers(1, 3), st.integers(1, 3)))
    padding = tuple(draw(st.integers(0, k // 2)) for k in kernel)
    hw = tuple(draw(st.integers(max(1, k - 2 * p), 6)) for k, p in zip(kernel, padding))
    return (draw(st.integers(1, 2)), draw(st.integers(1, 3))) + hw, kernel, stride, padding


@pytest.mark.parametrize("name", ["max_pool2d", "avg_pool2d"])
@given(data=st.data())
def test_pooling(backend, data, name):
    shape, kernel, stride, padding = data.draw(pool_geometry())
    check_op(backend, data, lambda x: getattr(F, name)(x, kernel, stride, padding),
             lambda x: getattr(ref, name)(x, kernel, stride or kernel, padding), [shape],
             torch_op=lambda x: getattr(TF, name)(x, kernel, stride, padding))


@given(data=st.data(), use_scale=st.booleans())
def test_upsample_nearest(backend, data, use_scale):
    shape = (1, 2) + data.draw(pairs(st.integers(1, 5), st.integers(1, 5)))
    if use_scale:
        scale = data.draw(st.integers(1, 3))
        out_hw, kwargs = (shape[2] * scale, shape[3] * scale), {"scale_factor": scale}
    else:
        out_hw = data.draw(pairs(st.integers(1, 7), st.integers(1, 7)))
        kwargs = {"size": out_hw}
    check_op(backend, data, lambda x: F.interpolate(x, **kwargs, mode="nearest"),
             lambda x: ref.upsample_nearest(x, out_hw), [shape],
             torch_op=lambda x: TF.interpolate(x, **kwargs, mode="nearest"))


@given(data=st.data(), align_corners=st.booleans())
def test_upsample_bilinear(backend, data, align_corners):
    shape = (1, 2) + data.draw(pairs(st.integers(1, 5), st.integers(1, 5)))
    out_hw = data.draw(pairs(st.integers(1, 7), st.integers(1, 7)))
    check_op(backend, data, lambda x: F.upsample(x, size=out_hw, mode="bilinear", align_corners=align_corners),
             lambda x: ref.upsample_bilinear(x, out_hw, align_corners), [shape],
             torch_op=lambda x: TF.interpolate(x, size=out_hw, mode="bilinear", align_corners=align_corners))


# ----- normalisation -----------------------------------------------------------------------
@given(data=st.data(), affine=st.booleans())
def test_layer_norm(backend, data, affine):
    shape = data.draw(shapes(min_dims=1, max_dims=3, min_side=1))
    n_norm = data.draw(st.integers(1, len(shape)))
    norm_shape = shape[len(shape) - n_norm:]
    inputs = [shape] + [norm_shape, norm_shape] * affine
    check_op(backend, data, lambda x, *wb: F.layer_norm(x, norm_shape, *wb),
             lambda x, *wb: ref.layer_norm(x, n_norm, *wb), inputs,
             torch_op=lambda x, *wb: TF.layer_norm(x, norm_shape, *wb), grad_tol=1e-4)


@pytest.mark.parametrize("act", ["none", "silu"])
@given(data=st.data(), affine=st.booleans())
def test_group_norm(backend, data, act, affine):
    groups = data.draw(st.integers(1, 3))
    shape = (data.draw(st.integers(1, 2)), groups * data.draw(st.integers(1, 2))) + data.draw(shapes(max_dims=2, min_side=1))
    if shape[1] // groups * int(np.prod(shape[2:])) < 2:
        shape = shape + (2,)
    inputs = [shape] + [(shape[1],)] * (2 * affine)

    def torch_op(x, *wb):
        y = TF.group_norm(x, groups, *wb)
        return TF.silu(y) if act == "silu" else y
    check_op(backend, data, lambda x, *wb: F.group_norm(x, groups, *wb, act=act),
             lambda x, *wb: ref.group_norm(x, groups, *wb, act=act), inputs, torch_op=torch_op, grad_tol=1e-4)


@st.composite
def batch_norm_shape(draw):
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 3))) + draw(shapes(max_dims=2, min_side=1, max_side=3))
    return shape if np.prod(shape) // shape[1] > 1 else (2,) + shape[1:]


@given(data=st.data(), affine=st.booleans())
def test_batch_norm_training(backend, data, affine):
    shape = data.draw(batch_norm_shape())
    inputs = [shape] + [(shape[1],)] * (2 * affine)
    check_op(backend, data, lambda x, *wb: F.batch_norm(x, None, None, *wb, training=True),
             lambda x, *wb: ref.batch_norm(x, None, None, *wb, training=True)[0], inputs,
             torch_op=lambda x, *wb: TF.batch_norm(x, None, None, *wb, training=True), grad_tol=1e-4)


@given(data=st.data(), affine=st.booleans())
def test_batch_norm_eval(backend, data, affine):
    shape = data.draw(batch_norm_shape())
    rng = np.random.default_rng(shape[1])
    stats = [rng.normal(size=shape[1]), rng.uniform(0.5, 2, size=shape[1])]
    inputs = [shape] + stats + [(shape[1],)] * (2 * affine)
    check_op(backend, data, lambda x, m, v, *wb: F.batch_norm(x, m, v, *wb, training=False),
             lambda x, m, v, *wb: ref.batch_norm(x, m, v, *wb, training=False)[0], inputs,
             torch_op=lambda x, m, v, *wb: TF.batch_norm(x, m, v, *wb, training=False),
             wrt=[0] + [3, 4] * affine)


@pytest.mark.parametrize("momentum", [0.1, 0.5])
def test_batch_norm_updates_running_stats(backend, momentum):
    x = np.random.default_rng(0).normal(size=(4, 3, 2, 2))
    mean, var = tc.zeros(3), tc.ones(3)
    F.batch_norm(tc.tensor(x, dtype=tc.float32), mean, var, training=True, momentum=momentum)
    _, want_mean, want_var = ref.batch_norm(x, np.zeros(3), np.ones(3), training=True, momentum=momentum)
    np.testing.assert_allclose(mean.numpy(), want_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var.numpy(), want_var, rtol=1e-5, atol=1e-6)


# ----- softmax family and losses -----------------------------------------------------------
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@given(data=st.data())
def test_softmax_family(backend, data, name):
    shape = data.draw(shapes(min_dims=1, min_side=1))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    check_op(backend, data, lambda x: [getattr(F, name)(x, axis), getattr(x, name)(axis)],
             lambda x: [getattr(ref, name)(x, axis)] * 2, [shape],
             torch_op=lambda x: [getattr(TF, name)(x, axis)] * 2, low=-5, high=5)


def test_softmax_of_large_logits_is_finite(backend):
    out = F.softmax(tc.tensor([[1000.0, 0.0, -1000.0]]), -1).numpy()
    np.testing.assert_allclose(out, [[1, 0, 0]], atol=1e-30)


_INF, _NAN = float("inf"), float("nan")
INFINITE_ROWS = [[_INF, 1.0], [-_INF, -_INF], [_INF, _INF], [-_INF, 1.0], [_INF, -_INF], [_NAN, 1.0],
                 [1.0] * 37 + [_INF], [1.0] * 37 + [_NAN], [-_INF] * 38, [-_INF] * 37 + [2.0]]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_of_infinities_matches_torch(backend, name, dtype):
    """A row holding +inf or NaN, or only -inf, is NaN throughout; -inf entries of a row with
    a finite maximum get probability 0 -- as PyTorch gives (short rows and long ones, whose
    maximum the kernels take in several lanes)."""
    if torch is None:
        pytest.skip("torch is not installed")
    for row in INFINITE_ROWS:
        out = getattr(F, name)(tc.tensor([row], dtype=dtype), -1).numpy()
        want = getattr(torch, name)(torch.tensor([row], dtype=getattr(torch, dtype)), -1).numpy()
        np.testing.assert_allclose(out, want, rtol=1e-6, err_msg=f"{name}({row})")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@given(data=st.data(), smoothing=st.sampled_from([0.0, 0.2]), spatial=st.booleans())
def test_cross_entropy(backend, data, reduction, smoothing, spatial):
    n, classes = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    extra = (data.draw(st.integers(1, 3)),) if spatial else ()
    target = np.array(data.draw(st.lists(st.integers(0, classes - 1), min_size=n * int(np.prod(extra)),
                                         max_size=n * int(np.prod(extra)))), dtype=np.int64).reshape((n,) + extra)
    target.reshape(-1)[0] = classes - 1  # at least one target is kept
    if target.size > 1:
        target.reshape(-1)[data.draw(st.integers(1, target.size - 1))] = -1  # one ignored
    kwargs = dict(ignore_index=-1, reduction=reduction, label_smoothing=smoothing)
    check_op(backend, data, lambda x, t: F.cross_entropy(x, t, **kwargs),
             lambda x, t: ref.cross_entropy(x, t, **kwargs), [(n, classes) + extra, target],
             torch_op=lambda x, t: TF.cross_entropy(x, t, **kwargs))


@pytest.mark.parametrize("name", ["mse_loss", "l1_loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@given(data=st.data())
def test_regression_losses(backend, data, name, reduction):
    shape = data.draw(shapes(min_side=1))
    fn = (lambda d: d * d) if name == "mse_loss" else np.abs
    reduce = {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction]
    check_op(backend, data, lambda x, y: getattr(F, name)(x, y, reduction=reduction),
             lambda x, y: reduce(fn(x - y)), [shape, shape],
             torch_op=lambda x, y: getattr(TF, name)(x, y, reduction=reduction))


@given(data=st.data(), weighted=st.booleans())
def test_binary_cross_entropy_with_logits(backend, data, weighted):
    shape = data.draw(shapes(min_dims=1, min_side=1))
    target = np.random.default_rng(len(shape)).uniform(0, 1, size=shape)
    pos_weight = [shape[-1:]] if weighted else []
    check_op(backend, data, lambda x, y, *pw: F.binary_cross_entropy_with_logits(x, y, pos_weight=pw[0] if pw else None),
             lambda x, y, *pw: ref.bce_with_logits(x, y, *pw), [shape, target] + pos_weight,
             torch_op=lambda x, y, *pw: TF.binary_cross_entropy_with_logits(x, y, pos_weight=pw[0] if pw else None),
             low=-4, high=4, wrt=[0, 1])  # torch does not differentiate pos_weight


# ----- dropout, embedding, attention, bias + activation ------------------------------------
@given(data=st.data(), p=st.sampled_from([0.0, 0.3]))
def test_dropout_identity_cases(backend, data, p):
    """Outside training, and with p = 0, dropout returns its input unchanged."""
    check_op(backend, data, lambda x: [F.dropout(x, p, training=False), F.dropout(x, 0.0)], lambda x: [x, x],
             [data.draw(shapes())], torch_op=lambda x: [TF.dropout(x, p, training=False), TF.dropout(x, 0.0)])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_statistics(backend, p):
    x = tc.ones(200, 100, requires_grad=True)
    y = F.dropout(x, p)
    kept = y.numpy() != 0
    assert abs(kept.mean() - (1 - p)) < 0.02
    np.testing.assert_allclose(y.numpy()[kept], 1 / (1 - p), rtol=1e-6)
    y.backward(tc.ones(200, 100))
    np.testing.assert_array_equal(x.grad.numpy(), y.numpy())  # the same mask and scale


def test_dropout_is_reproducible_with_a_generator(backend):
    x = tc.ones(50)
    first = F.dropout(x, 0.5, generator=tc.Generator(x.device, seed=3)).numpy()
    second = F.dropout(x, 0.5, generator=tc.Generator(x.device, seed=3)).numpy()
    np.testing.assert_array_equal(first, second)
    assert F.dropout(x, 1.0).numpy().sum() == 0


@given(data=st.data())
def test_embedding(backend, data):
    num, dim = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3))
    index_shape = data.draw(shapes(max_dims=2))
    size = int(np.prod(index_shape))
    indices = np.array(data.draw(st.lists(st.integers(0, num - 1), min_size=size, max_size=size)),
                       dtype=np.int64).reshape(index_shape)  # repeats accumulate in the backward
    check_op(backend, data, lambda w, i: F.embedding(i, w), lambda w, i: w[i], [(num, dim), indices],
             torch_op=lambda w, i: TF.embedding(i, w))


@given(data=st.data(), mask_kind=st.sampled_from(["none", "bool", "float", "causal"]))
def test_scaled_dot_product_attention(backend, data, mask_kind):
    lead = data.draw(shapes(max_dims=2, min_side=1, max_side=2))
    lq, lk, d, dv = (data.draw(st.integers(1, 4)) for _ in range(4))
    if mask_kind == "causal":
        lk = max(lk, lq)  # every query keeps at least one key
    inputs = [lead + (lq, d), lead + (lk, d), lead + (lk, dv)]
    mask = None
    if mask_kind == "bool":
        mask = np.random.default_rng(lq * lk).random((lq, lk)) > 0.4
        mask[:, 0] = True
    elif mask_kind == "float":
        mask = np.random.default_rng(lq * lk).normal(size=(lq, lk))
    scale = data.draw(st.none() | st.just(0.3))

    def op(q, k, v, *m):
        return F.scaled_dot_product_attention(q, k, v, m[0] if m else None, mask_kind == "causal", scale)

    def reference(q, k, v, *m):
        return ref.attention(q, k, v, m[0] if m else None, mask_kind == "causal", scale)

    def torch_op(q, k, v, *m):
        return TF.scaled_dot_product_attention(q, k, v, m[0] if m else None, is_causal=mask_kind == "causal", scale=scale)
    check_op(backend, data, op, reference, inputs + ([mask] if mask is not None else []), torch_op=torch_op,
             wrt=[0, 1, 2])


@given(data=st.data(), with_bias=st.booleans(), lead=st.sampled_from([(), (3,), (2, 3)]))
def test_linear(backend, data, with_bias, lead):
    """x Wᵀ + b over x [*, in] (1-D, 2-D and batched x), gradients for all three."""
    inputs = [lead + (4,), (5, 4)] + [(5,)] * with_bias
    check_op(backend, data, lambda x, w, *b: F.linear(x, w, b[0] if b else None),
             lambda x, w, *b: x @ w.T + (b[0] if b else 0), inputs,
             torch_op=lambda x, w, *b: TF.linear(x, w, b[0] if b else None))


def test_linear_rejects_bad_shapes():
    x, w = tc.zeros(2, 4), tc.zeros(5, 4)
    with pytest.raises(ValueError, match=r"linear: input \(2, 3\) must end in in_features=4"):
        F.linear(tc.zeros(2, 3), w)
    with pytest.raises(ValueError, match="linear: weight must be"):
        F.linear(x, tc.zeros(4))
    with pytest.raises(ValueError, match=r"linear: bias must have shape \(5,\)"):
        F.linear(x, w, tc.zeros(4))


@pytest.mark.parametrize("act", list(ref.ACTIVATIONS))
@given(data=st.data(), with_bias=st.booleans())
def test_bias_act(backend, data, act, with_bias):
    shape = data.draw(shapes(min_dims=1, max_dims=3))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    torch_acts = {"none": lambda x: x, "relu": TF.relu, "gelu": TF.gelu, "silu": TF.silu, "sigmoid": torch.sigmoid,
                  "tanh": torch.tanh, "gelu_tanh": lambda x: TF.gelu(x, approximate="tanh")} if torch else {}

    def torch_op(x, *b):
        shape_b = [1] * x.ndim
        shape_b[axis] = -1
        return torch_acts[act](x + b[0].reshape(shape_b) if b else x)
    check_op(backend, data, lambda x, *b: F.bias_act(x, b[0] if b else None, act, axis),
             lambda x, *b: ref.bias_act(x, b[0] if b else None, act, axis % len(shape)),
             [shape] + [(shape[axis],)] * with_bias, torch_op=torch_op)
