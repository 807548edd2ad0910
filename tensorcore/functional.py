"""``tensorcore.functional``: the functional forms of the neural-network ops (as torch.nn.functional)."""

from .backends.base import ACTIVATIONS  # the names fused activations (``act=``) accept

from .ops import (avg_pool2d, batch_norm, bias_act, binary_cross_entropy_with_logits, conv2d,
                  conv_transpose2d, cross_entropy, dropout, embedding, gated_activation, gelu, group_norm,
                  interpolate, l1_loss, layer_norm, leaky_relu, linear, log_softmax, max_pool2d, mse_loss, relu,
                  scaled_dot_product_attention, sigmoid, silu, softmax, softplus, tanh, upsample, pad)

__all__ = [
    "ACTIVATIONS",
    "avg_pool2d", "batch_norm", "bias_act", "binary_cross_entropy_with_logits", "conv2d",
    "conv_transpose2d", "cross_entropy", "dropout", "embedding", "gated_activation", "gelu", "group_norm",
    "interpolate",
    "l1_loss", "layer_norm", "leaky_relu", "linear", "log_softmax", "max_pool2d", "mse_loss", "relu",
    "scaled_dot_product_attention", "sigmoid", "silu", "softmax", "softplus", "tanh", "upsample", "pad",
]
