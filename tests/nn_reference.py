"""Float64 NumPy references for the neural-network ops, written for clarity, not speed.

Each follows the definition in the PyTorch documentation (NCHW images, weights
[Cout, Cin/groups, kh, kw], transposed-conv weights [Cin, Cout/groups, kh, kw]).
"""

from __future__ import annotations

import math

import numpy as np

Pair = tuple[int, int]


def _windows(x: np.ndarray, kernel: Pair, stride: Pair, dilation: Pair, out_hw: Pair):
    """Yield (i, j, patch) with patch[..., oh, ow] = x[..., oh*sh + i*dh, ow*sw + j*dw]."""
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            top, left = i * dilation[0], j * dilation[1]
            yield i, j, x[..., top:top + stride[0] * (out_hw[0] - 1) + 1:stride[0],
                          left:left + stride[1] * (out_hw[1] - 1) + 1:stride[1]]


def _out_size(n: int, k: int, s: int, p: int, d: int) -> int:
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def conv2d(x, w, b=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    n, _, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    out_hw = (_out_size(h, kh, stride[0], padding[0], dilation[0]), _out_size(wd, kw, stride[1], padding[1], dilation[1]))
    padded = np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    out = np.zeros((n, cout) + out_hw)
    cout_g = cout // groups
    for g in range(groups):
        xg, wg = padded[:, g * cin_g:(g + 1) * cin_g], w[g * cout_g:(g + 1) * cout_g]
        for i, j, patch in _windows(xg, (kh, kw), stride, dilation, out_hw):
            out[:, g * cout_g:(g + 1) * cout_g] += np.einsum("nchw,oc->nohw", patch, wg[:, :, i, j])
    return out if b is None else out + b[None, :, None, None]


def conv_transpose2d(x, w, b=None, stride=(1, 1), padding=(0, 0), output_padding=(0, 0), groups=1, dilation=(1, 1)):
    """Scatter every input pixel times the kernel into the output, then crop the padding."""
    n, cin, h, wd = x.shape
    _, cout_g, kh, kw = w.shape
    cin_g = cin // groups
    full_hw = tuple((m - 1) * s + d * (k - 1) + 1 + op
                    for m, s, d, k, op in zip((h, wd), stride, dilation, (kh, kw), output_padding))
    full = np.zeros((n, cout_g * groups) + full_hw)
    for g in range(groups):
        xg, wg = x[:, g * cin_g:(g + 1) * cin_g], w[g * cin_g:(g + 1) * cin_g]
        for i, j, target in _windows(full[:, g * cout_g:(g + 1) * cout_g], (kh, kw), stride, dilation, (h, wd)):
            target += np.einsum("nchw,co->nohw", xg, wg[:, :, i, j])
    out_hw = tuple(f - 2 * p for f, p in zip(full_hw, padding))
    out = full[:, :, padding[0]:padding[0] + out_hw[0], padding[1]:padding[1] + out_hw[1]]
    return out if b is None else out + b[None, :, None, None]


def _pool(x, kernel, stride, padding, fill, reduce):
    padded = np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2), constant_values=fill)
    out_hw = tuple(_out_size(n, k, s, p, 1) for n, k, s, p in zip(x.shape[2:], kernel, stride, padding))
    return reduce(np.stack([patch for _, _, patch in _windows(padded, kernel, stride, (1, 1), out_hw)]), axis=0)


def max_pool2d(x, kernel, stride, padding):
    return _pool(x, kernel, stride, padding, -np.inf, np.max)


def avg_pool2d(x, kernel, stride, padding):
    """Zero padding counts in the divisor (count_include_pad=True)."""
    return _pool(x, kernel, stride, padding, 0.0, np.mean)


def upsample_nearest(x, out_hw):
    """PyTorch 'nearest': source index floor(dst * in/out), the scale in float32."""
    rows, cols = (np.minimum(np.floor(np.arange(o, dtype=np.float32) * np.float32(n / o)).astype(int), n - 1)
                  for n, o in zip(x.shape[2:], out_hw))
    return x[:, :, rows][:, :, :, cols]


def _linear_weights(n: int, o: int, align_corners: bool) -> np.ndarray:
    """[o, n] matrix of 1-D linear interpolation weights."""
    dst = np.arange(o, dtype=np.float64)
    if align_corners:
        src = dst * ((n - 1) / (o - 1) if o > 1 else 0.0)
    else:
        src = np.maximum((dst + 0.5) * (n / o) - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(int), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    frac = src - lo
    a = np.zeros((o, n))
    np.add.at(a, (np.arange(o), lo), 1 - frac)
    np.add.at(a, (np.arange(o), hi), frac)
    return a


def upsample_bilinear(x, out_hw, align_corners):
    a_h, a_w = (_linear_weights(n, o, align_corners) for n, o in zip(x.shape[2:], out_hw))
    return np.einsum("oh,nchw,pw->ncop", a_h, x, a_w)


def _normalize(x, axes, eps):
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def layer_norm(x, n_norm, weight=None, bias=None, eps=1e-5):
    y = _normalize(x, tuple(range(x.ndim - n_norm, x.ndim)), eps)
    return y * (1 if weight is None else weight) + (0 if bias is None else bias)


def _per_channel(v, ndim):
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def group_norm(x, groups, weight=None, bias=None, eps=1e-5, act="none"):
    n, c = x.shape[:2]
    y = _normalize(x.reshape(n, groups, -1), (2,), eps).reshape(x.shape)
    if weight is not None:
        y = y * _per_channel(weight, x.ndim)
    if bias is not None:
        y = y + _per_channel(bias, x.ndim)
    return ACTIVATIONS[act](y)


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """Returns (y, new running mean, new running var); the running var is unbiased."""
    axes = (0,) + tuple(range(2, x.ndim))
    if training:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
        count = x.size // x.shape[1]
        if running_mean is not None:
            running_mean = (1 - momentum) * running_mean + momentum * mean
            running_var = (1 - momentum) * running_var + momentum * var * count / (count - 1)
    else:
        mean, var = running_mean, running_var
    y = (x - _per_channel(mean, x.ndim)) / np.sqrt(_per_channel(var, x.ndim) + eps)
    if weight is not None:
        y = y * _per_channel(weight, x.ndim)
    if bias is not None:
        y = y + _per_channel(bias, x.ndim)
    return y, running_mean, running_var


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    return np.log(softmax(x, axis))


def cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """Class-index targets; logits [N, C, *], target [N, *]."""
    logp = log_softmax(logits, axis=1)
    classes = logits.shape[1]
    keep = target != ignore_index
    picked = np.take_along_axis(logp, np.where(keep, target, 0)[:, None], axis=1)[:, 0]
    loss = -(1 - label_smoothing) * picked - label_smoothing / classes * logp.sum(axis=1)
    loss = np.where(keep, loss, 0.0)
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / keep.sum()


def bce_with_logits(x, y, pos_weight=None):
    """Mean of -[w_pos * y * log(sigmoid(x)) + (1 - y) * log(1 - sigmoid(x))]."""
    log_sig = -np.logaddexp(0, -x)
    log_one_minus = -np.logaddexp(0, x)
    w = 1.0 if pos_weight is None else pos_weight
    return np.mean(-(w * y * log_sig + (1 - y) * log_one_minus))


def attention(q, k, v, mask=None, causal=False, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        lq, lk = scores.shape[-2:]
        scores = np.where(np.tril(np.ones((lq, lk), bool)), scores, -np.inf)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + mask
    return softmax(scores) @ v


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


ACTIVATIONS = {
    "none": lambda x: x,
    "relu": lambda x: np.maximum(x, 0),
    "gelu": lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    "silu": lambda x: x * sigmoid(x),
    "sigmoid": sigmoid,
    "tanh": np.tanh,
}


def bias_act(x, bias, act, axis):
    shape = [1] * x.ndim
    shape[axis] = -1
    return ACTIVATIONS[act](x if bias is None else x + bias.reshape(shape))
