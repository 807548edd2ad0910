"""The Tensor: a backend array plus what autograd needs.

Every method here is a thin call into ``tensorcore.ops``; the ops hold the Functions
(forward + backward) and the Functions call the backend.  That is the whole path of
an op: ``Tensor.method`` -> ``ops`` Function -> ``backend`` kernel.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import dlpack, dtypes, versions
from .backends import backend_for
from .devices import canonical, is_device

_ARRAY_TYPES: tuple[type, ...] = (np.ndarray,)

_rebind_lock = threading.Lock()
_rebinds = 0


def note_rebind() -> None:
    """Count a rebinding of a tensor whose class announces them (``announces_rebinds``,
    as Parameter does): new storage or a new ``requires_grad``.  A compiled plan checks
    the bindings of such tensors only when this count has moved since its last check."""
    global _rebinds
    with _rebind_lock:
        _rebinds += 1


def rebinds() -> int:
    """How many announced rebindings there have been (see ``note_rebind``)."""
    return _rebinds


class Tensor:
    """An n-dimensional array on a device, optionally tracking gradients."""

    __slots__ = ("data", "device", "requires_grad", "grad", "_ctx", "_retains_grad", "__weakref__")
    __array_priority__ = 1000  # NumPy defers ``ndarray op Tensor`` to the Tensor
    announces_rebinds = False  # True where every change of .data / .requires_grad calls note_rebind()

    def __init__(self, data: Any, device: str = "cpu", requires_grad: bool = False) -> None:
        self.data = data
        self.device = device
        self.grad: Tensor | None = None
        self._ctx = None
        self._retains_grad = False
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def _wrap(cls, data: Any, device: str) -> "Tensor":
        """Fast constructor for op results (NumPy may hand back a scalar: make it 0-d)."""
        if isinstance(data, np.generic):
            data = np.asarray(data)
        t = cls.__new__(cls)
        t.data, t.device, t.grad, t._ctx, t._retains_grad, t.requires_grad = data, device, None, None, False, False
        return t

    # ----- metadata ------------------------------------------------------------------
    @property
    def backend(self) -> Any:
        return backend_for(self.device)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    def dim(self) -> int:
        return self.data.ndim

    def size(self, dim: int | None = None) -> tuple[int, ...] | int:
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return int(self.data.size)

    @property
    def _version(self) -> int:
        """How many writes the engine made into this tensor's memory (shared with its
        views), as PyTorch's ``_version``: see ``tensorcore/versions.py``."""
        return versions.version(self.data)

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    @property
    def T(self) -> "Tensor":
        """The axes reversed: the transpose of a matrix (PyTorch deprecates it for other ranks)."""
        return ops.permute(self, tuple(reversed(range(self.ndim))))

    @property
    def mT(self) -> "Tensor":
        """The last two axes swapped: each matrix of a batch transposed (as torch's ``mT``)."""
        if self.ndim < 2:
            raise ValueError(f"mT: needs a tensor of at least 2 dims, got shape {self.shape}")
        return ops.transpose(self, -2, -1)

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Iterator["Tensor"]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        body = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        return f"tensor({body}, dtype={self.dtype}, device='{self.device}'{grad})"

    __hash__ = object.__hash__

    # ----- autograd ------------------------------------------------------------------
    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if requires_grad and not dtypes.is_floating(self.dtype):
            raise TypeError(f"requires_grad: only floating-point tensors can require grad, got {self.dtype}")
        if not requires_grad and self._ctx is not None:
            raise ValueError("requires_grad_: cannot turn off gradients of a non-leaf tensor; use detach()")
        self.requires_grad = requires_grad
        return self

    def retain_grad(self) -> None:
        """Keep the gradient of this non-leaf tensor in ``.grad`` after backward."""
        self._retains_grad = True

    def register_post_accumulate_grad_hook(self, hook: Callable[["Tensor"], None]) -> "autograd.RemovableHandle":
        """Call ``hook(self)`` in every backward pass once this leaf's gradient is complete
        in ``.grad``; returns a handle whose ``remove()`` unregisters it."""
        return autograd.register_post_accumulate_grad_hook(self, hook)

    def detach(self) -> "Tensor":
        return Tensor._wrap(self.data, self.device)

    def backward(self, gradient: Any = None, retain_graph: bool = False) -> None:
        """Accumulate this tensor's gradient into the leaves' ``.grad``; the graph is
        freed afterwards unless ``retain_graph`` keeps it for another backward."""
        autograd.backward(self, gradient, retain_graph)

    def zero_grad(self) -> None:
        self.grad = None

    # ----- host interop --------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The values as a NumPy array (a copy from the GPU; shared memory on the CPU)."""
        return self.backend.to_numpy(self.data)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self.numpy()
        return out.astype(dtype, copy=False) if dtype is not None else out

    def item(self) -> Any:
        if self.data.size != 1:
            raise ValueError(f"item: only one-element tensors can be converted, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def __bool__(self) -> bool:
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if dtypes.is_floating(self.dtype) or self.data.size != 1:
            raise TypeError("only integer tensors of a single element can be used as an index")
        return int(self.item())

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        versions.mark_shared(self.data)  # the consumer may write it where no version counts
        if stream is not None:  # NumPy accepts no stream argument at all
            kwargs["stream"] = stream
        if self.dtype == dtypes.bfloat16:  # NumPy cannot export it: the raw buffer with the bfloat16 type code
            return dlpack.export_bfloat16(self.data, **kwargs)
        return self.data.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.data.__dlpack_device__()

    # ----- conversion ----------------------------------------------------------------
    def to(self, target: Any = None, dtype: Any = None) -> "Tensor":
        """``to("cuda")`` (or ``"cuda:0"``, ``tc.device(...)``), ``to(tc.float16)`` or
        ``to("cpu", dtype=...)``; differentiable."""
        if target is not None and not is_device(target):
            target, dtype = None, target
        target = canonical(target) if target is not None else None  # checks it before any work
        out = self
        if dtype is not None and dtypes.as_dtype(dtype) != self.dtype:
            out = ops.astype(out, dtypes.as_dtype(dtype))
        if target is not None and target != out.device:
            out = ops.to_device(out, target)
        return out

    def cpu(self) -> "Tensor": return self.to("cpu")
    def cuda(self) -> "Tensor": return self.to("cuda")
    def float(self) -> "Tensor": return self.to(dtypes.float32)
    def double(self) -> "Tensor": return self.to(dtypes.float64)
    def half(self) -> "Tensor": return self.to(dtypes.float16)
    def bfloat16(self) -> "Tensor": return self.to(dtypes.bfloat16)
    def long(self) -> "Tensor": return self.to(dtypes.int64)
    def int(self) -> "Tensor": return self.to(dtypes.int32)
    def bool(self) -> "Tensor": return self.to(dtypes.bool_)
    def type(self, dtype: Any) -> "Tensor": return self.to(dtype)

    def clone(self) -> "Tensor": return ops.clone(self)
    def contiguous(self) -> "Tensor": return ops.clone(self) if not _is_contiguous(self.data) else self

    # ----- in-place updates (no autograd through them, as PyTorch under no_grad) ----------
    def _check_inplace(self, op: str) -> None:
        if self.requires_grad and autograd.is_grad_enabled():
            raise RuntimeError(f"{op}: a tensor that requires grad cannot be modified in place outside no_grad()")

    def _check_operand_shape(self, other: "Tensor", op: str) -> None:
        """An in-place operand must broadcast to this tensor's shape (the result never grows)."""
        if other.shape != self.shape and ops.shape_utils.broadcast_shapes(op, other.shape, self.shape) != self.shape:
            raise ValueError(f"{op}: operand shape {other.shape} does not broadcast to {self.shape}")

    def copy_(self, src: Any) -> "Tensor":
        self._check_inplace("copy_")
        src = as_tensor_like(src, self, "copy_")
        if src.device != self.device:
            src = src.to(self.device)
        self._check_operand_shape(src, "copy_")
        self.backend.copy_(self.data, self.backend.astype(src.data, self.dtype))
        versions.bump(self.data)
        return self

    def fill_(self, value: Any) -> "Tensor":
        self._check_inplace("fill_")
        self.backend.copy_(self.data, self.backend.full((), value, self.dtype))
        versions.bump(self.data)
        return self

    def zero_(self) -> "Tensor":
        return self.fill_(0)

    def add_(self, other: Any, alpha: float = 1.0) -> "Tensor":
        self._check_inplace("add_")
        other = as_tensor_like(other, self, "add_")
        self._check_operand_shape(other, "add_")
        self.backend.add_(self.data, self.backend.binary("mul", other.data, alpha) if alpha != 1 else other.data)
        versions.bump(self.data)
        return self

    def mul_(self, other: Any) -> "Tensor":
        self._check_inplace("mul_")
        other = other.data if isinstance(other, Tensor) else other
        self.backend.copy_(self.data, self.backend.binary("mul", self.data, other))
        versions.bump(self.data)
        return self

    def clamp_(self, min: float | None = None, max: float | None = None) -> "Tensor":  # noqa: A002
        self._check_inplace("clamp_")
        self.backend.copy_(self.data, self.backend.clip(self.data, min, max))
        versions.bump(self.data)
        return self

    def uniform_(self, low: float = 0.0, high: float = 1.0, generator: Any = None) -> "Tensor":
        self._check_inplace("uniform_")
        return self.copy_(random.rand(*self.shape, dtype=self.dtype, device=self.device, generator=generator) * (high - low) + low)

    def normal_(self, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> "Tensor":
        self._check_inplace("normal_")
        return self.copy_(random.randn(*self.shape, dtype=self.dtype, device=self.device, generator=generator) * std + mean)

    # ----- arithmetic ----------------------------------------------------------------
    def __add__(self, o: Any) -> "Tensor": return ops.add(self, o)
    def __radd__(self, o: Any) -> "Tensor": return ops.add(o, self)
    def __sub__(self, o: Any) -> "Tensor": return ops.sub(self, o)
    def __rsub__(self, o: Any) -> "Tensor": return ops.sub(o, self)
    def __mul__(self, o: Any) -> "Tensor": return ops.mul(self, o)
    def __rmul__(self, o: Any) -> "Tensor": return ops.mul(o, self)
    def __truediv__(self, o: Any) -> "Tensor": return ops.div(self, o)
    def __rtruediv__(self, o: Any) -> "Tensor": return ops.div(o, self)
    def __pow__(self, o: Any) -> "Tensor": return ops.pow(self, o)
    def __rpow__(self, o: Any) -> "Tensor": return ops.pow(o, self)
    def __matmul__(self, o: Any) -> "Tensor": return ops.matmul(self, o)
    def __rmatmul__(self, o: Any) -> "Tensor": return ops.matmul(o, self)
    def __neg__(self) -> "Tensor": return ops.neg(self)
    def __pos__(self) -> "Tensor": return self
    def __abs__(self) -> "Tensor": return ops.abs(self)
    def __eq__(self, o: Any) -> "Tensor": return ops.compare("eq", self, o)  # type: ignore[override]
    def __ne__(self, o: Any) -> "Tensor": return ops.compare("ne", self, o)  # type: ignore[override]
    def __lt__(self, o: Any) -> "Tensor": return ops.compare("lt", self, o)
    def __le__(self, o: Any) -> "Tensor": return ops.compare("le", self, o)
    def __gt__(self, o: Any) -> "Tensor": return ops.compare("gt", self, o)
    def __ge__(self, o: Any) -> "Tensor": return ops.compare("ge", self, o)
    def __invert__(self) -> "Tensor": return ops.logical_not(self)
    def __and__(self, o: Any) -> "Tensor": return ops.compare("logical_and", self, o)
    def __or__(self, o: Any) -> "Tensor": return ops.compare("logical_or", self, o)

    # in-place arithmetic writes into this tensor's memory (views see it), as in PyTorch
    def __iadd__(self, o: Any) -> "Tensor": return self._assign(ops.add(self, o))
    def __isub__(self, o: Any) -> "Tensor": return self._assign(ops.sub(self, o))
    def __imul__(self, o: Any) -> "Tensor": return self._assign(ops.mul(self, o))
    def __itruediv__(self, o: Any) -> "Tensor": return self._assign(ops.div(self, o))

    def _assign(self, value: "Tensor") -> "Tensor":
        if value.shape != self.shape:
            raise ValueError(f"in-place op: result shape {value.shape} does not match the tensor's {self.shape}")
        ops.setitem(self, Ellipsis, value)
        return self

    def __getitem__(self, index: Any) -> "Tensor": return ops.getitem(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        ops.setitem(self, index, value)

    # ----- math ----------------------------------------------------------------------
    def exp(self) -> "Tensor": return ops.exp(self)
    def log(self) -> "Tensor": return ops.log(self)
    def log1p(self) -> "Tensor": return ops.log1p(self)
    def sqrt(self) -> "Tensor": return ops.sqrt(self)
    def rsqrt(self) -> "Tensor": return ops.rsqrt(self)
    def sin(self) -> "Tensor": return ops.sin(self)
    def cos(self) -> "Tensor": return ops.cos(self)
    def tanh(self) -> "Tensor": return ops.tanh(self)
    def sigmoid(self) -> "Tensor": return ops.sigmoid(self)
    def relu(self) -> "Tensor": return ops.relu(self)
    def abs(self) -> "Tensor": return ops.abs(self)
    def neg(self) -> "Tensor": return ops.neg(self)
    def sign(self) -> "Tensor": return ops.sign(self)
    def pow(self, e: Any) -> "Tensor": return ops.pow(self, e)
    def clip(self, min: float | None = None, max: float | None = None) -> "Tensor": return ops.clip(self, min, max)  # noqa: A002
    clamp = clip
    def maximum(self, o: Any) -> "Tensor": return ops.maximum(self, o)
    def minimum(self, o: Any) -> "Tensor": return ops.minimum(self, o)
    def masked_fill(self, mask: Any, value: float) -> "Tensor": return ops.where(mask, value, self)
    def matmul(self, o: Any) -> "Tensor": return ops.matmul(self, o)

    # ----- reductions ----------------------------------------------------------------
    # NumPy's axis=/keepdims= or PyTorch's dim=/keepdim=; max and min given dim= return
    # (values, indices) as in PyTorch
    def sum(self, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: bool | None = None) -> "Tensor":
        return ops.sum(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def mean(self, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: bool | None = None) -> "Tensor":
        return ops.mean(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def var(self, axis: Any = None, keepdims: bool = False, correction: int = 1, *, dim: Any = None,
            keepdim: bool | None = None) -> "Tensor":
        return ops.var(self, axis, keepdims, correction, dim=dim, keepdim=keepdim)

    def std(self, axis: Any = None, keepdims: bool = False, correction: int = 1, *, dim: Any = None,
            keepdim: bool | None = None) -> "Tensor":
        return ops.std(self, axis, keepdims, correction, dim=dim, keepdim=keepdim)

    def max(self, axis: Any = None, keepdims: bool = False, *, dim: int | None = None, keepdim: bool | None = None) -> Any:
        return ops.max(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def min(self, axis: Any = None, keepdims: bool = False, *, dim: int | None = None, keepdim: bool | None = None) -> Any:
        return ops.min(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def prod(self, axis: Any = None, keepdims: bool = False, *, dim: Any = None, keepdim: bool | None = None) -> "Tensor":
        return ops.prod(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def logsumexp(self, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
                  keepdim: bool | None = None) -> "Tensor":
        return ops.logsumexp(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def argmax(self, axis: int | None = None, keepdims: bool = False, *, dim: int | None = None,
               keepdim: bool | None = None) -> "Tensor":
        return ops.argmax(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def argmin(self, axis: int | None = None, keepdims: bool = False, *, dim: int | None = None,
               keepdim: bool | None = None) -> "Tensor":
        return ops.argmin(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def softmax(self, axis: int | None = None, *, dim: int | None = None) -> "Tensor":
        return ops.softmax(self, axis, dim=dim)

    def log_softmax(self, axis: int | None = None, *, dim: int | None = None) -> "Tensor":
        return ops.log_softmax(self, axis, dim=dim)

    # ----- shape ---------------------------------------------------------------------
    def reshape(self, *shape: Any) -> "Tensor": return ops.reshape(self, _shape_args(shape))
    def view(self, *shape: Any) -> "Tensor": return ops.reshape(self, _shape_args(shape))
    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor": return ops.flatten(self, start_dim, end_dim)
    def permute(self, *axes: Any) -> "Tensor": return ops.permute(self, _shape_args(axes))
    def transpose(self, dim0: int = -2, dim1: int = -1) -> "Tensor": return ops.transpose(self, dim0, dim1)
    def expand(self, *shape: Any) -> "Tensor": return ops.expand(self, _shape_args(shape))
    def expand_as(self, other: "Tensor") -> "Tensor": return ops.expand(self, other.shape)
    def squeeze(self, axis: Any = None) -> "Tensor": return ops.squeeze(self, axis)
    def unsqueeze(self, axis: int) -> "Tensor": return ops.unsqueeze(self, axis)
    def flip(self, axes: Any) -> "Tensor": return ops.flip(self, axes)
    def repeat(self, *repeats: Any) -> "Tensor": return ops.repeat(self, _shape_args(repeats))
    def chunk(self, chunks: int, axis: int = 0) -> list["Tensor"]: return ops.chunk(self, chunks, axis)
    def split(self, size: Any, axis: int = 0) -> list["Tensor"]: return ops.split(self, size, axis)


def _shape_args(args: Sequence[Any]) -> tuple[int, ...]:
    """Accept ``f(2, 3)`` and ``f((2, 3))`` alike."""
    if len(args) == 1 and isinstance(args[0], tuple | list):
        return tuple(args[0])
    return tuple(args)


def _is_contiguous(a: Any) -> bool:
    return bool(a.flags.c_contiguous)


def as_tensor_like(value: Any, like: Any, op: str) -> Tensor:
    """``value`` as a Tensor on the device of ``like`` (a Tensor or None)."""
    if isinstance(value, Tensor):
        return value
    device = like.device if isinstance(like, Tensor) else backends.default_device
    backend = backend_for(device)
    if isinstance(value, bool | int | float):  # the dtype it would have as an operand of ``like``
        dtype = dtypes.result_dtype(like, value) if isinstance(like, Tensor) else dtypes.scalar_dtype(value)
        return Tensor._wrap(backend.full((), value, dtype), device)
    try:
        array = backend.array(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{op}: cannot use a {type(value).__name__} as a tensor") from exc
    if array.dtype.kind not in "biu" and not dtypes.is_floating(array.dtype):  # e.g. strings: no arithmetic on them
        raise TypeError(f"{op}: cannot use a {type(value).__name__} of dtype {array.dtype} as a tensor")
    return Tensor._wrap(array, device)


from . import autograd, backends, ops, random  # noqa: E402  (these import Tensor)
