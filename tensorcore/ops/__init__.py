"""Differentiable ops, grouped by kind; each module pairs Functions with public functions."""

from .activation import bias_act, log_softmax, softmax
from .attention import scaled_dot_product_attention
from .conv import avg_pool2d, conv2d, conv_transpose2d, interpolate, max_pool2d, upsample
from .elementwise import (abs, add, clip, compare, cos, div, erf, exp, gated_activation, gelu, leaky_relu, log,
                          log1p, maximum, minimum, mul, neg, pow, relu, rsqrt, sigmoid, sign, silu, sin, softplus,
                          sqrt, sub, tanh, unary, where)
from .embedding import dropout, embedding
from .indexing import getitem, setitem
from .linalg import linear, matmul
from .loss import binary_cross_entropy_with_logits, cross_entropy, l1_loss, mse_loss
from .movement import (astype, broadcast_to, cat, chunk, clone, concatenate, expand, flatten, flip, pad,
                       permute, repeat, reshape, split, squeeze, stack, to_device, transpose, unsqueeze)
from .norm import batch_norm, group_norm, layer_norm
from .reduce import argmax, argmin, logsumexp, max, mean, min, prod, std, sum, var


def logical_not(x):
    """Elementwise not of a bool tensor (no gradient)."""
    return x._wrap(x.backend.unary("logical_not", x.data), x.device)


__all__ = [name for name in dir() if not name.startswith("_")]
