"""tensorcore: a small tensor engine with reverse-mode autodiff and pluggable backends.

    import tensorcore as tc
    x = tc.randn(3, 4, requires_grad=True)
    (x * x).sum().backward()
"""

from . import settings
from . import cuda, dtypes, functional
from .autograd import Function, is_grad_enabled, no_grad, set_grad_enabled
from .backends import get_backend, set_backend, use_backend
from .backends.numba.threads import get_num_threads, set_num_threads
from .creation import (arange, as_tensor, empty, empty_like, eye, from_dlpack, from_numpy, full, full_like,
                       linspace, ones, ones_like, tensor, zeros, zeros_like)
from .devices import device
from .memory_format import channels_last, contiguous_format
from .dtypes import bool_, float16, float32, float64, int32, int64, uint8
from .ops import (abs, argmax, argmin, cat, chunk, clip, concatenate, cos, exp, flatten, flip, log, log1p,
                  logsumexp, matmul, max, maximum, mean, min, minimum, pad, permute, prod, relu, repeat,
                  reshape, rsqrt, sigmoid, sin, softmax, log_softmax, split, sqrt, squeeze, stack, std, sum,
                  tanh, transpose, unsqueeze, var, where)
from .random import Generator, manual_seed, rand, rand_like, randint, randn, randn_like
from .settings import get_matmul_precision, set_matmul_precision
from .tensor import Tensor

bool = bool_  # noqa: A001  (torch-style dtype aliases)
half, float, double, long, int = float16, float32, float64, int64, int32  # noqa: A001
clamp = clip

__version__ = "0.1.0"

from .compile import chain, compile  # noqa: E402,A001  (last: the tracer builds on everything above)


def __getattr__(name: str):
    """``tc.bfloat16``, made on first use (``dtypes.bfloat16_dtype``: importing
    ``ml_dtypes`` takes most of a second)."""
    if name == "bfloat16":
        return dtypes.bfloat16_dtype()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "bfloat16"])
