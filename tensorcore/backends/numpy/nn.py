"""The reference implementation of every fused op of the backend protocol.

``NumpyNNKernels`` combines one mixin per family of ops; all of them are written
against ``self.xp`` only, so a backend whose array module mimics NumPy (CuPy) inherits
a working version of each kernel and overrides the ones it makes faster.
"""

from __future__ import annotations

from typing import Any

from .act import NumpyActivationKernels
from .conv import NumpyConvKernels
from .lora import NumpyLoraKernels
from .norm import NumpyNormKernels
from .pool import NumpyPoolKernels
from .softmax import NumpySoftmaxKernels
from .upsample import NumpyUpsampleKernels
from .scatter import scatter_add

Array = Any


class NumpyNNKernels(NumpyConvKernels, NumpyPoolKernels, NumpyUpsampleKernels,
                     NumpySoftmaxKernels, NumpyNormKernels, NumpyActivationKernels, NumpyLoraKernels):
    """Convolution, pooling, resampling, softmax, normalisation, bias + activation,
    attention, the LoRA linear and embedding backward for any NumPy-like ``xp``."""

    xp: Any

    def embedding_backward(self, grad: Array, indices: Array, num_embeddings: int
                           ) -> Array:
        """Scatter-add rows of grad [*, D] into a [num_embeddings, D] array; rows whose
        index repeats are summed."""
        if tuple(grad.shape[:-1]) != tuple(indices.shape):
            raise ValueError(f"embedding_backward: grad of shape {grad.shape} does not "
                             f"match indices of shape {indices.shape} plus a feature axis")
        dim = grad.shape[-1]
        out = self.xp.zeros((num_embeddings, dim), dtype=grad.dtype)
        scatter_add(self.xp, out, indices.reshape(-1), grad.reshape(-1, dim))
        return out
