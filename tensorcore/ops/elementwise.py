"""Elementwise ops: arithmetic, comparisons, math functions and activations."""

from __future__ import annotations

import math
from typing import Any

from .. import autograd, dtypes
from ..autograd import Function
from ..tensor import Tensor, as_tensor_like
from .movement import astype
from .shape_utils import broadcast_shapes, unbroadcast

Scalar = int | float | bool


# ----- binary arithmetic ---------------------------------------------------------------
class Add(Function):
    def forward(self, a, b):
        return self.backend.binary("add", a, b)

    def backward(self, g):
        a, b = self.inputs
        return unbroadcast(self.backend, g, _shape(a)), unbroadcast(self.backend, g, _shape(b))


class Sub(Function):
    def forward(self, a, b):
        return self.backend.binary("sub", a, b)

    def backward(self, g):
        (a, b), be = self.inputs, self.backend
        return unbroadcast(be, g, _shape(a)), unbroadcast(be, be.unary("neg", g), _shape(b))


class Mul(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        return self.backend.binary("mul", a, b)

    def backward(self, g):
        be = self.backend
        grad_a = unbroadcast(be, be.binary("mul", g, self.b), _shape(self.a)) if self.needs_grad(0) else None
        grad_b = unbroadcast(be, be.binary("mul", g, self.a), _shape(self.b)) if self.needs_grad(1) else None
        return grad_a, grad_b


class Div(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        return self.backend.binary("div", a, b)

    def backward(self, g):
        be = self.backend
        ga = be.binary("div", g, self.b)
        gb = be.unary("neg", be.binary("div", be.binary("mul", ga, self.a), self.b))
        return unbroadcast(be, ga, _shape(self.a)), unbroadcast(be, gb, _shape(self.b))


class Pow(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        self.y = self.backend.binary("pow", a, b)
        return self.y

    def backward(self, g):
        be = self.backend
        # d a**b / da = b * a**(b-1);  d / db = a**b * log(a)
        b_minus_1 = self.b - 1 if isinstance(self.b, Scalar) else be.binary("sub", self.b, 1)
        da = be.binary("mul", be.binary("mul", g, self.b), be.binary("pow", self.a, b_minus_1))
        grad_b = None
        if not isinstance(self.b, Scalar):
            safe_log = be.unary("log", be.where(be.binary("gt", self.a, 0), self.a, 1))
            grad_b = unbroadcast(be, be.binary("mul", be.binary("mul", g, self.y), safe_log), _shape(self.b))
        return unbroadcast(be, da, _shape(self.a)), grad_b


class Maximum(Function):
    """max(a, b); ties send half the gradient to each side (as PyTorch)."""

    op = "maximum"

    def forward(self, a, b):
        self.a, self.b = a, b
        return self.backend.binary(self.op, a, b)

    def backward(self, g):
        be = self.backend
        first = "gt" if self.op == "maximum" else "lt"
        wins = be.astype(be.binary(first, self.a, self.b), g.dtype)
        ties = be.binary("mul", be.astype(be.binary("eq", self.a, self.b), g.dtype), 0.5)
        share_a = be.binary("add", wins, ties)
        share_b = be.binary("sub", 1, share_a)
        return (unbroadcast(be, be.binary("mul", g, share_a), _shape(self.a)),
                unbroadcast(be, be.binary("mul", g, share_b), _shape(self.b)))


class Minimum(Maximum):
    op = "minimum"


class Where(Function):
    def forward(self, cond, a, b):
        self.cond, self.shapes = cond, (_shape(a), _shape(b))
        return self.backend.where(cond, a, b)

    def backward(self, g):
        be = self.backend
        zero = be.zeros((), g.dtype)
        return (None, unbroadcast(be, be.where(self.cond, g, zero), self.shapes[0]),
                unbroadcast(be, be.where(self.cond, zero, g), self.shapes[1]))


class Clip(Function):
    def forward(self, a, lo, hi):
        self.a, self.lo, self.hi = a, lo, hi
        return self.backend.clip(a, lo, hi)

    def backward(self, g):
        be = self.backend
        inside = be.full(_shape(self.a), True, bool)
        if self.lo is not None:
            inside = be.binary("logical_and", inside, be.binary("ge", self.a, self.lo))
        if self.hi is not None:
            inside = be.binary("logical_and", inside, be.binary("le", self.a, self.hi))
        return be.where(inside, g, be.zeros((), g.dtype)), None, None


# ----- unary math ----------------------------------------------------------------------
def _grad_exp(be, x, y, g): return be.binary("mul", g, y)
def _grad_log(be, x, y, g): return be.binary("div", g, x)
def _grad_log1p(be, x, y, g): return be.binary("div", g, be.binary("add", x, 1))
def _grad_sqrt(be, x, y, g): return be.binary("div", be.binary("mul", g, 0.5), y)
def _grad_rsqrt(be, x, y, g): return be.binary("mul", g, be.binary("mul", be.binary("pow", y, 3), -0.5))
def _grad_sin(be, x, y, g): return be.binary("mul", g, be.unary("cos", x))
def _grad_cos(be, x, y, g): return be.unary("neg", be.binary("mul", g, be.unary("sin", x)))
def _grad_tanh(be, x, y, g): return be.binary("mul", g, be.binary("sub", 1, be.binary("mul", y, y)))
def _grad_sigmoid(be, x, y, g): return be.binary("mul", g, be.binary("mul", y, be.binary("sub", 1, y)))
def _grad_abs(be, x, y, g): return be.binary("mul", g, be.unary("sign", x))
def _grad_neg(be, x, y, g): return be.unary("neg", g)
def _grad_softplus(be, x, y, g): return be.binary("mul", g, be.unary("sigmoid", x))
def _grad_erf(be, x, y, g):
    return be.binary("mul", g, be.binary("mul", be.unary("exp", be.unary("neg", be.binary("mul", x, x))), 2 / math.sqrt(math.pi)))
def _grad_activation(act):
    return lambda be, x, y, g: be.activation_grad(act, x, g)


_UNARY_GRADS = {
    "exp": _grad_exp, "log": _grad_log, "log1p": _grad_log1p, "sqrt": _grad_sqrt,
    "rsqrt": _grad_rsqrt, "sin": _grad_sin, "cos": _grad_cos, "tanh": _grad_tanh,
    "sigmoid": _grad_sigmoid, "abs": _grad_abs, "neg": _grad_neg, "softplus": _grad_softplus,
    "erf": _grad_erf, "relu": _grad_activation("relu"), "gelu": _grad_activation("gelu"),
    "gelu_tanh": _grad_activation("gelu_tanh"), "silu": _grad_activation("silu"),
}


# ops whose result is floating whatever the input: integer and bool inputs compute in
# the default float dtype (as PyTorch), not NumPy's float64
_FLOAT_VALUED = frozenset(_UNARY_GRADS) - {"abs", "neg", "relu"}


class Unary(Function):
    """y = op(x) for the math functions and activations in ``_UNARY_GRADS``."""

    def forward(self, x, op):
        if op in _FLOAT_VALUED and not dtypes.is_floating(x.dtype):
            x = self.backend.astype(x, dtypes.default_float)
        self.x, self.op = x, op
        self.y = self.backend.unary(op, x)
        return self.y

    def backward(self, g):
        return (_UNARY_GRADS[self.op](self.backend, self.x, self.y, g),)


class LeakyRelu(Function):
    def forward(self, x, slope):
        self.x, self.slope = x, slope
        return self.backend.leaky_relu(x, slope)

    def backward(self, g):
        be = self.backend
        return be.where(be.binary("gt", self.x, 0), g, be.binary("mul", g, self.slope)), None


# ----- public functions ----------------------------------------------------------------
def _binary(fn: type[Function], a: Any, b: Any) -> Tensor:
    if (type(a) is not Tensor or type(b) is not Tensor or a.dtype != b.dtype
            or (fn is Div and not dtypes.is_floating(a.dtype))):  # else nothing to convert
        a, b = _promoted(*_operands(a, b, fn.__name__.lower()), true_division=fn is Div)
    try:
        return fn.apply(a, b)
    except ValueError:
        broadcast_shapes(fn.__name__.lower(), _shape(a), _shape(b))  # names the op when the shapes are the cause
        raise


def _promoted(*operands: Any, true_division: bool = False) -> list[Any]:
    """Tensor operands cast to the result dtype (``dtypes.result_dtype``, PyTorch's rules);
    Python scalars stay as they are, which NumPy treats as taking the tensor's dtype.
    True division of integers gives the default float dtype."""
    dtype = dtypes.result_dtype(*operands)
    if true_division and not dtypes.is_floating(dtype):
        dtype = dtypes.default_float
    return [astype(x, dtype) if isinstance(x, Tensor) and x.dtype != dtype else x for x in operands]


def _operands(a: Any, b: Any, op: str) -> tuple[Any, Any]:
    """Tensors stay; Python scalars stay (NumPy weak-scalar promotion); arrays become tensors."""
    if not isinstance(a, Tensor | Scalar):
        a = as_tensor_like(a, b, op)
    if not isinstance(b, Tensor | Scalar):
        b = as_tensor_like(b, a, op)
    if not isinstance(a, Tensor):
        a = as_tensor_like(a, b, op)
    return a, b


def add(a: Any, b: Any) -> Tensor: return _binary(Add, a, b)
def sub(a: Any, b: Any) -> Tensor: return _binary(Sub, a, b)
def mul(a: Any, b: Any) -> Tensor: return _binary(Mul, a, b)
def div(a: Any, b: Any) -> Tensor: return _binary(Div, a, b)
def pow(a: Any, b: Any) -> Tensor: return _binary(Pow, a, b)  # noqa: A001
def maximum(a: Any, b: Any) -> Tensor: return _binary(Maximum, a, b)
def minimum(a: Any, b: Any) -> Tensor: return _binary(Minimum, a, b)


def unary(op: str, x: Tensor) -> Tensor:
    return Unary.apply(x, op)


def exp(x: Tensor) -> Tensor: return Unary.apply(x, "exp")
def log(x: Tensor) -> Tensor: return Unary.apply(x, "log")
def log1p(x: Tensor) -> Tensor: return Unary.apply(x, "log1p")
def sqrt(x: Tensor) -> Tensor: return Unary.apply(x, "sqrt")
def rsqrt(x: Tensor) -> Tensor: return Unary.apply(x, "rsqrt")
def sin(x: Tensor) -> Tensor: return Unary.apply(x, "sin")
def cos(x: Tensor) -> Tensor: return Unary.apply(x, "cos")
def tanh(x: Tensor) -> Tensor: return Unary.apply(x, "tanh")
def sigmoid(x: Tensor) -> Tensor: return Unary.apply(x, "sigmoid")
def relu(x: Tensor) -> Tensor: return Unary.apply(x, "relu")
def silu(x: Tensor) -> Tensor: return Unary.apply(x, "silu")
def softplus(x: Tensor) -> Tensor: return Unary.apply(x, "softplus")
def erf(x: Tensor) -> Tensor: return Unary.apply(x, "erf")
def neg(x: Tensor) -> Tensor: return Unary.apply(x, "neg")
def abs(x: Tensor) -> Tensor: return Unary.apply(x, "abs")  # noqa: A001


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU; ``approximate='tanh'`` selects the tanh form (as PyTorch)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return Unary.apply(x, "gelu" if approximate == "none" else "gelu_tanh")


class _GatedActivation(Function):
    """The one-pass gate of ``gated_activation`` (taken only when no gradient is needed)."""

    def forward(self, x, act):
        return self.backend.gated_activation(x, act)


def gated_activation(x: Tensor, act: str = "gelu") -> Tensor:
    """``a * act(b)`` for ``[a | b]`` = ``x`` split in halves along its last axis: GEGLU's gate
    with "gelu" (``act``: one of ``ACTIVATIONS`` but "none").  Without gradients the backend
    makes it in one pass over ``x`` (no copy of the strided halves, no intermediate)."""
    from ..backends.base import ACTIVATIONS

    if act not in ACTIVATIONS or act == "none":
        raise ValueError(f"gated_activation: act must be one of {[a for a in ACTIVATIONS if a != 'none']}, "
                         f"got {act!r}")
    if x.ndim < 1 or x.shape[-1] % 2:
        raise ValueError(f"gated_activation: the last axis must have an even size, got shape {x.shape}")
    if autograd.is_grad_enabled() and x.requires_grad:
        a, b = x.chunk(2, axis=-1)
        return a * Unary.apply(b, act)
    return _GatedActivation.apply(x, act)


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    return LeakyRelu.apply(x, float(negative_slope))


def where(cond: Any, a: Any, b: Any) -> Tensor:
    """Elementwise ``a if cond else b``; cond is a bool tensor (no gradient)."""
    if isinstance(cond, Tensor) and not isinstance(a, Tensor) and not isinstance(b, Tensor):
        a = Tensor._wrap(cond.backend.array(a), cond.device)  # two scalars follow cond's device
    a, b = _operands(a, b, "where")
    if not isinstance(b, Tensor):
        b = as_tensor_like(b, a, "where")
    cond = as_tensor_like(cond, a, "where")
    a, b = _promoted(a, b)
    try:
        return Where.apply(cond.detach(), a, b)
    except ValueError:
        broadcast_shapes("where", cond.shape, a.shape, b.shape)
        raise


def clip(x: Tensor, min: float | None = None, max: float | None = None) -> Tensor:  # noqa: A002
    if min is None and max is None:
        raise ValueError("clip: at least one of min and max must be given")
    x = _promoted(x, *(bound for bound in (min, max) if bound is not None))[0]  # int tensor, float bound: float
    return Clip.apply(x, min, max)


def compare(op: str, a: Any, b: Any) -> Tensor:
    """eq ne lt le gt ge: a bool tensor, outside autograd."""
    a, b = _operands(a, b, op)
    try:
        out = a.backend.binary(op, a.data, b.data if isinstance(b, Tensor) else b)
    except ValueError:
        broadcast_shapes(op, a.shape, _shape(b))
        raise
    return Tensor._wrap(out, a.device)


def sign(x: Tensor) -> Tensor:
    return Tensor._wrap(x.backend.unary("sign", x.data), x.device)


def _shape(a: Any) -> tuple[int, ...]:
    return tuple(getattr(a, "shape", ()))
