"""The NumPy backend: the complete, readable reference for every kernel.

Primitives live here and are written against ``self.xp`` so the CuPy backend inherits
them by swapping the array module.  The elementwise primitives, ``matmul``, ``clip`` and
``concatenate`` take an optional ``out=`` array (compiled replay writes results into
its planned buffers with it); the fused ops live in ``nn`` and the optimizer updates
in ``optim``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy

from ...dtypes import is_bfloat16
from .. import fused_program
from ..bfloat16 import computes_in_float32
from ..dispatch import serving
from .act import NumpyActivationKernels, check_activation
from .conv import NumpyConvKernels
from .executor import CpuReplay
from .lora import NumpyLoraKernels
from .nn import NumpyNNKernels
from .norm import NumpyNormKernels
from .optim import NumpyOptimKernels
from .pool import NumpyPoolKernels
from .softmax import NumpySoftmaxKernels
from .special import erf
from .upsample import NumpyUpsampleKernels


def stacked_rows(a: Any, b: Any, out: Any = None) -> tuple[Any, Any, Any] | None:
    """``a @ b`` for a stack of matrices a [..., M, K] (C-contiguous) times one matrix b
    [K, N] as one 2-D product: (a's rows [-1, K], b, ``out``'s rows [-1, N] or None);
    None for any other operands, or an ``out`` that is not C-contiguous.

    NumPy multiplies such a stack as one small GEMM per matrix, each on one thread; as
    one product of all the rows, BLAS splits the work across its threads (2-4x faster
    at a transformer's [64, 16, 64] @ [64, 64]).  Every ``matmul`` path of the CPU
    backends (eager, compiled replay, native plans) takes the same product, so their
    results agree bit for bit."""
    if not (getattr(a, "ndim", 0) > 2 and getattr(b, "ndim", 0) == 2 and a.size and a.flags.c_contiguous
            and a.shape[-1] == b.shape[0]):
        return None
    if out is not None and not (out.flags.c_contiguous and out.shape == (*a.shape[:-1], b.shape[1])):
        return None
    return a.reshape(-1, a.shape[-1]), b, None if out is None else out.reshape(-1, b.shape[1])


_UNARY = {
    "neg": "negative", "abs": "abs", "sign": "sign", "exp": "exp", "log": "log",
    "log1p": "log1p", "sqrt": "sqrt", "sin": "sin", "cos": "cos", "tanh": "tanh",
    "floor": "floor", "ceil": "ceil", "round": "round", "logical_not": "logical_not",
    "isnan": "isnan", "isinf": "isinf",
}
_BINARY = {
    "add": "add", "sub": "subtract", "mul": "multiply", "div": "true_divide",
    "pow": "power", "maximum": "maximum", "minimum": "minimum", "eq": "equal",
    "ne": "not_equal", "lt": "less", "le": "less_equal", "gt": "greater",
    "ge": "greater_equal", "logical_and": "logical_and", "logical_or": "logical_or",
    "floordiv": "floor_divide", "mod": "remainder",
}
_REDUCE = {"sum": "sum", "max": "max", "min": "min", "prod": "prod", "any": "any", "all": "all"}


def kind_has_name(ins: tuple) -> bool:
    """Whether a fused-program instruction names its op after its kind."""
    return ins[0] in ("unary", "act", "binary")


def _copy_call(dest: Any, method: Callable, name: str, a: Any) -> None:
    dest[...] = method(name, a)


def _run_all(calls: tuple) -> None:
    for call in calls:
        call()


def _into(out: Any, result: Any) -> Any:
    """``result``, copied into ``out`` when an output buffer is given."""
    if out is None:
        return result
    out[...] = result
    return out


class NumpyPrimitives:
    """Allocation, elementwise, reductions, movement, indexing, matmul and RNG."""

    xp: Any = numpy

    # ----- allocation and transfer -------------------------------------------------
    def array(self, obj: Any, dtype: Any = None) -> Any:
        return self.xp.array(obj, dtype=dtype)

    def empty(self, shape, dtype):
        return self.xp.empty(shape, dtype=dtype)

    def zeros(self, shape, dtype):
        return self.xp.zeros(shape, dtype=dtype)

    def full(self, shape, value, dtype):
        return self.xp.full(shape, value, dtype=dtype)

    def arange(self, start, stop, step, dtype):
        return self.xp.arange(start, stop, step, dtype=dtype)

    def linspace(self, start, stop, num, dtype):
        return self.xp.linspace(start, stop, num, dtype=dtype)

    def eye(self, n, m, dtype):
        return self.xp.eye(n, m, dtype=dtype)

    def to_numpy(self, a):
        return numpy.asarray(a)

    def from_numpy(self, a):
        return self.xp.asarray(a)

    def from_dlpack(self, obj):
        return self.xp.from_dlpack(obj)

    def empty_cache(self) -> None:
        """Nothing to free: the reference keeps no buffers between calls."""

    def kernels_pending(self) -> bool:
        """Never: the reference compiles nothing."""
        return False

    def release_stream(self, stream: int) -> None:
        """Nothing to free: the reference keeps no buffers per stream."""

    def astype(self, a, dtype):
        return a.astype(dtype, copy=False)

    def copy(self, a):
        return a.copy()

    def copy_(self, dst, src) -> None:
        dst[...] = src

    def add_(self, dst, src) -> None:
        self.xp.add(dst, src, out=dst, casting="unsafe")

    # ----- elementwise -------------------------------------------------------------
    def gated_activation(self, x, act: str, bias=None):
        if bias is not None:
            x = self.binary("add", x, bias)
        half = x.shape[-1] // 2
        return self.binary("mul", x[..., :half], self.unary(act, x[..., half:]))

    def unary(self, op: str, a, out=None):
        xp = self.xp
        if op in _UNARY:
            return getattr(xp, _UNARY[op])(a, out=out)
        if op == "rsqrt":
            return xp.divide(1, xp.sqrt(a, out=out), out=out)
        if op == "relu":
            return xp.maximum(a, a.dtype.type(0), out=out)
        if op == "softplus":
            return xp.logaddexp(a, a.dtype.type(0), out=out)
        if op == "erf":
            return _into(out, erf(xp, a))
        return _into(out, self.bias_act(a, None, op, 0))  # sigmoid and the other activations

    def binary(self, op: str, a, b, out=None):
        y = getattr(self.xp, _BINARY[op])(a, b, out=out)
        return y if out is not None else _keep_bfloat16(y, a, b)

    def where(self, cond, a, b, out=None):
        if out is None:
            y = self.xp.where(cond, a, b)
            dtype = getattr(a, "dtype", None)
            if dtype is not None and dtype == getattr(b, "dtype", None) and y.dtype != dtype:
                y = y.astype(dtype)  # CuPy widens bfloat16
            return y
        self.xp.copyto(out, b)
        self.xp.copyto(out, a, where=cond)
        return out

    def clip(self, a, lo, hi, out=None):
        xp = self.xp
        if lo is None:  # CuPy's clip takes no None bound
            y = xp.minimum(a, hi, out=out)
        elif hi is None:
            y = xp.maximum(a, lo, out=out)
        else:
            y = xp.clip(a, lo, hi, out=out)
        return y if y.dtype == a.dtype else y.astype(a.dtype)  # NumPy widens bfloat16 for float bounds

    def leaky_relu(self, a, slope):
        return self.xp.where(a > 0, a, a * a.dtype.type(slope))

    def fused_elementwise(self, program: tuple, inputs: Sequence[Any]):
        """Run a fused elementwise program (``backends/fused_program.py``) one op at a
        time with this backend's own methods: the reference, equal bit for bit to the
        unfused calls (the Numba and CuPy backends generate one kernel instead)."""
        fused_program.check(program, [a.dtype.name for a in inputs])
        regs: list[Any] = list(inputs)
        for ins in program[1]:
            kind = ins[0]
            if kind == "const":
                regs.append(fused_program.const_value(ins[1], ins[2]))
            elif kind == "unary":
                regs.append(self.unary(ins[1], regs[ins[2]]))
            elif kind == "act":
                regs.append(self.bias_act(regs[ins[2]], None, ins[1], 0))
            elif kind == "binary":
                regs.append(self.binary(ins[1], regs[ins[2]], regs[ins[3]]))
            else:
                regs.append(self.where(regs[ins[1]], regs[ins[2]], regs[ins[3]]))
        shape = numpy.broadcast_shapes(*[a.shape for a in inputs])
        result = self.xp.asarray(regs[-1])
        if result.shape != shape:
            result = self.xp.broadcast_to(result, shape)
        return self.xp.ascontiguousarray(result)

    # ----- reductions --------------------------------------------------------------
    def reduce(self, op: str, a, axes, keepdims: bool):
        if (op == "sum" and isinstance(axes, tuple) and len(axes) > 1 and min(axes) == 0
                and a.ndim > 2 and a.flags.c_contiguous):
            # Adding whole contiguous slabs over the leading axis first vectorises; a
            # multi-axis sum walks the strided layout (NCHW bias gradients).
            rest = tuple(sorted(ax - 1 for ax in axes if ax != 0))
            out = a.sum(axis=0).sum(axis=rest)
            if keepdims:
                out = out.reshape([1 if i in axes else n for i, n in enumerate(a.shape)])
            return out
        return getattr(self.xp, _REDUCE[op])(a, axis=axes, keepdims=keepdims)

    def arg_reduce(self, op: str, a, axis, keepdims: bool):
        out = getattr(self.xp, op)(a, axis=axis, keepdims=keepdims)
        return out.astype(numpy.int64, copy=False)

    # ----- movement and indexing ---------------------------------------------------
    def reshape(self, a, shape):
        return a.reshape(shape)

    def transpose(self, a, axes):
        return a.transpose(axes)

    def broadcast_to(self, a, shape):
        return self.xp.broadcast_to(a, shape)

    def concatenate(self, arrays: Sequence[Any], axis: int, out=None):
        return self.xp.concatenate(arrays, axis=axis, out=out)

    def stack(self, arrays: Sequence[Any], axis: int):
        return self.xp.stack(arrays, axis=axis)

    def pad(self, a, widths, value):
        return self.xp.pad(a, widths, mode="constant", constant_values=value)

    def flip(self, a, axes):
        return self.xp.flip(a, axis=tuple(axes))

    def getitem(self, a, index):
        return a[index]

    def setitem_(self, a, index, value) -> None:
        a[index] = value

    def index_add_(self, dst, index, value) -> None:
        self.xp.add.at(dst, index, value)

    # ----- linear algebra ----------------------------------------------------------
    def matmul(self, a, b, out=None):
        rows = stacked_rows(a, b, out)
        if rows is None:
            return self.xp.matmul(a, b, out=out)
        y = self.xp.matmul(rows[0], rows[1], out=rows[2])
        return y.reshape(*a.shape[:-1], b.shape[1]) if out is None else out

    def matmul_bias_act(self, a, b, bias, act: str, residual=None):
        """``bias_act(matmul(a, b), bias, act, -1)`` as those two calls of this backend,
        then ``binary("add", ..., residual)`` when a residual is given."""
        check_activation("matmul_bias_act", act)
        y = self.bias_act(self.matmul(a, b), bias, act, -1)
        return y if residual is None else self.binary("add", y, residual)

    def matmul_bias_act_group(self, a, products):
        """``matmul_bias_act(a, b, bias, act)`` for each (b, bias, act) of ``products``."""
        return tuple(self.matmul_bias_act(a, *p) for p in self._group_products(products))

    @staticmethod
    def _group_products(products) -> list:
        """``products`` as a list of (b, bias, act) triples, each act a known activation."""
        if not isinstance(products, (tuple, list)) or not products \
                or any(not isinstance(p, (tuple, list)) or len(p) != 3 for p in products):
            raise TypeError(f"matmul_bias_act_group: products must be a non-empty sequence of "
                            f"(b, bias, act) triples, got {products!r:.200}")
        for _, _, act in products:
            check_activation("matmul_bias_act_group", act)
        return [tuple(p) for p in products]

    # ----- compiled replay -----------------------------------------------------------
    def prepare(self, op: str, args: tuple, kwargs: dict, out: Any) -> Callable[[], Any] | None:
        """The elementwise ufuncs and matmul bound to their arrays and ``out``, and a
        reshape that copies as one copy into ``out`` (NumPy arrays only: the CuPy backend
        runs its own kernels for these)."""
        if type(self).xp is not numpy or kwargs or out is None or is_bfloat16(out.dtype):
            return None
        if op == "binary" and args[0] in _BINARY:
            return functools.partial(getattr(numpy, _BINARY[args[0]]), args[1], args[2], out=out)
        if op == "unary" and args[0] in _UNARY:
            return functools.partial(getattr(numpy, _UNARY[args[0]]), args[1], out=out)
        if op == "matmul" and not any(is_bfloat16(getattr(a, "dtype", None)) for a in args):
            a, b, rows_out = stacked_rows(*args, out) or (*args, out)
            return functools.partial(numpy.matmul, a, b, out=rows_out)
        if op == "fused_elementwise":
            return self._prepare_fused(*args, out)
        if op == "reshape" and isinstance(args[0], numpy.ndarray) and args[0].dtype == out.dtype \
                and args[0].size == out.size and out.flags.c_contiguous:  # a reshape that copies: one copy
            return functools.partial(numpy.copyto, out.reshape(args[0].shape), args[0])
        return None

    def _prepare_fused(self, program: tuple, inputs: Sequence[Any], out: Any) -> Callable[[], Any]:
        """A fused program as a loop of calls writing into buffers made once (the last
        one into ``out``): NumPy's ufuncs with ``out=``, other ops copied in."""
        kinds = fused_program.check(program, [a.dtype.name for a in inputs])
        regs: list[Any] = list(inputs)
        calls: list[Callable[[], Any]] = []
        code = program[1]
        for i, ins in enumerate(code):
            kind = ins[0]
            if kind == "const":
                regs.append(fused_program.const_value(ins[1], ins[2]))
                continue
            operands = [regs[r] for r in ins[2 if kind_has_name(ins) else 1:]]
            shape = numpy.broadcast_shapes(*[numpy.shape(a) for a in operands])
            dest = out if i == len(code) - 1 else numpy.empty(shape, kinds[len(inputs) + i])
            if kind == "binary":
                calls.append(functools.partial(getattr(numpy, _BINARY[ins[1]]), *operands, out=dest))
            elif kind == "unary" and ins[1] in _UNARY:
                calls.append(functools.partial(getattr(numpy, _UNARY[ins[1]]), *operands, out=dest))
            elif kind == "where":
                calls.append(functools.partial(self.where, *operands, out=dest))
            else:
                method = self.unary if kind == "unary" else (lambda act, x: self.bias_act(x, None, act, 0))
                calls.append(functools.partial(_copy_call, dest, method, ins[1], operands[0]))
            regs.append(dest)
        if not calls:  # a program of constants: fill once per call all the same
            return functools.partial(numpy.copyto, out, regs[-1])
        return functools.partial(_run_all, tuple(calls))

    # ----- RNG ---------------------------------------------------------------------
    def rng(self, seed: int):
        return numpy.random.Generator(numpy.random.PCG64(seed))

    def uniform(self, rng, shape, low, high, dtype):
        return self.from_numpy(rng.uniform(low, high, size=shape).astype(dtype))

    def normal(self, rng, shape, mean, std, dtype):
        return self.from_numpy(rng.normal(mean, std, size=shape).astype(dtype))

    def integers(self, rng, shape, low, high, dtype):
        return self.from_numpy(rng.integers(low, high, size=shape).astype(dtype))


def _keep_bfloat16(y, a, b):
    """``y`` rounded back to bfloat16 where a bfloat16 array met a Python number: the
    number is weak (PyTorch's and NumPy 2's rule), but CuPy widens bfloat16 for it."""
    array, number = (a, b) if hasattr(a, "dtype") else (b, a)
    if isinstance(number, float | int) and is_bfloat16(array.dtype) and y.dtype.kind == "f":
        return y.astype(array.dtype)
    return y


# Which function serves each protocol method (``backends/dispatch.py``).  The ops that
# accumulate run bfloat16 arguments in float32 (``backends/bfloat16.py``).
METHODS: dict[str, Callable] = {
    # allocation and transfer
    "array": NumpyPrimitives.array,
    "empty": NumpyPrimitives.empty,
    "zeros": NumpyPrimitives.zeros,
    "full": NumpyPrimitives.full,
    "arange": NumpyPrimitives.arange,
    "linspace": NumpyPrimitives.linspace,
    "eye": NumpyPrimitives.eye,
    "to_numpy": NumpyPrimitives.to_numpy,
    "from_numpy": NumpyPrimitives.from_numpy,
    "from_dlpack": NumpyPrimitives.from_dlpack,
    "astype": NumpyPrimitives.astype,
    "copy": NumpyPrimitives.copy,
    "copy_": NumpyPrimitives.copy_,
    "add_": NumpyPrimitives.add_,
    "empty_cache": NumpyPrimitives.empty_cache,
    "release_stream": NumpyPrimitives.release_stream,
    "kernels_pending": NumpyPrimitives.kernels_pending,
    # elementwise
    "unary": NumpyPrimitives.unary,
    "gated_activation": NumpyPrimitives.gated_activation,
    "binary": NumpyPrimitives.binary,
    "where": NumpyPrimitives.where,
    "clip": NumpyPrimitives.clip,
    "leaky_relu": NumpyPrimitives.leaky_relu,
    "activation_grad": NumpyActivationKernels.activation_grad,
    "fused_elementwise": NumpyPrimitives.fused_elementwise,
    # reductions
    "reduce": computes_in_float32(NumpyPrimitives.reduce),
    "arg_reduce": NumpyPrimitives.arg_reduce,
    # movement and indexing
    "reshape": NumpyPrimitives.reshape,
    "transpose": NumpyPrimitives.transpose,
    "broadcast_to": NumpyPrimitives.broadcast_to,
    "concatenate": NumpyPrimitives.concatenate,
    "stack": NumpyPrimitives.stack,
    "pad": NumpyPrimitives.pad,
    "flip": NumpyPrimitives.flip,
    "getitem": NumpyPrimitives.getitem,
    "setitem_": NumpyPrimitives.setitem_,
    "index_add_": computes_in_float32(NumpyPrimitives.index_add_),
    # linear algebra
    "matmul": computes_in_float32(NumpyPrimitives.matmul),
    "matmul_bias_act": NumpyPrimitives.matmul_bias_act,
    "matmul_bias_act_group": NumpyPrimitives.matmul_bias_act_group,
    "lora_linear": computes_in_float32(NumpyLoraKernels.lora_linear),
    # convolution
    "conv2d": computes_in_float32(NumpyConvKernels.conv2d),
    "group_norm_conv2d": NumpyConvKernels.group_norm_conv2d,
    "upsample_conv2d": NumpyConvKernels.upsample_conv2d,
    "conv2d_grad_input": computes_in_float32(NumpyConvKernels.conv2d_grad_input),
    "conv2d_grad_weight": computes_in_float32(NumpyConvKernels.conv2d_grad_weight),
    # pooling and resampling
    "max_pool2d": NumpyPoolKernels.max_pool2d,
    "max_pool2d_backward": computes_in_float32(NumpyPoolKernels.max_pool2d_backward),
    "avg_pool2d": computes_in_float32(NumpyPoolKernels.avg_pool2d),
    "avg_pool2d_backward": computes_in_float32(NumpyPoolKernels.avg_pool2d_backward),
    "upsample_nearest2d": NumpyUpsampleKernels.upsample_nearest2d,
    "upsample_nearest2d_backward": computes_in_float32(NumpyUpsampleKernels.upsample_nearest2d_backward),
    "upsample_bilinear2d": computes_in_float32(NumpyUpsampleKernels.upsample_bilinear2d),
    "upsample_bilinear2d_backward": computes_in_float32(NumpyUpsampleKernels.upsample_bilinear2d_backward),
    # softmax family and attention
    "softmax": computes_in_float32(NumpySoftmaxKernels.softmax),
    "softmax_backward": computes_in_float32(NumpySoftmaxKernels.softmax_backward),
    "log_softmax": computes_in_float32(NumpySoftmaxKernels.log_softmax),
    "log_softmax_backward": computes_in_float32(NumpySoftmaxKernels.log_softmax_backward),
    "cross_entropy": computes_in_float32(NumpySoftmaxKernels.cross_entropy),
    "cross_entropy_backward": computes_in_float32(NumpySoftmaxKernels.cross_entropy_backward),
    "cross_entropy_reduced": computes_in_float32(NumpySoftmaxKernels.cross_entropy_reduced),
    "cross_entropy_reduced_backward": computes_in_float32(NumpySoftmaxKernels.cross_entropy_reduced_backward),
    "attention": computes_in_float32(NumpySoftmaxKernels.attention),
    "attention_backward": computes_in_float32(NumpySoftmaxKernels.attention_backward),
    "attention_output": computes_in_float32(NumpySoftmaxKernels.attention_output),
    "attention_lse": NumpySoftmaxKernels.attention_lse,
    "attention_lse_backward": computes_in_float32(NumpySoftmaxKernels.attention_lse_backward),
    # normalisation
    "layer_norm": computes_in_float32(NumpyNormKernels.layer_norm),
    "layer_norm_backward": computes_in_float32(NumpyNormKernels.layer_norm_backward),
    "group_norm": computes_in_float32(NumpyNormKernels.group_norm),
    "group_norm_backward": computes_in_float32(NumpyNormKernels.group_norm_backward),
    "batch_norm": computes_in_float32(NumpyNormKernels.batch_norm),
    "batch_norm_backward": computes_in_float32(NumpyNormKernels.batch_norm_backward),
    # fused elementwise and embedding
    "bias_act": NumpyActivationKernels.bias_act,
    "bias_act_backward": computes_in_float32(NumpyActivationKernels.bias_act_backward),
    "embedding_backward": computes_in_float32(NumpyNNKernels.embedding_backward),
    # RNG
    "rng": NumpyPrimitives.rng,
    "uniform": NumpyPrimitives.uniform,
    "normal": NumpyPrimitives.normal,
    "integers": NumpyPrimitives.integers,
    # optimizer updates
    "sgd_update_": computes_in_float32(NumpyOptimKernels.sgd_update_),
    "adam_update_": computes_in_float32(NumpyOptimKernels.adam_update_),
    "rmsprop_update_": computes_in_float32(NumpyOptimKernels.rmsprop_update_),
    "adagrad_update_": computes_in_float32(NumpyOptimKernels.adagrad_update_),
    "lamb_update_": computes_in_float32(NumpyOptimKernels.lamb_update_),
    "lars_update_": computes_in_float32(NumpyOptimKernels.lars_update_),
    "lion_update_": computes_in_float32(NumpyOptimKernels.lion_update_),
    # compiled replay
    "prepare": NumpyPrimitives.prepare,
}


@serving(METHODS)
class NumpyBackend(NumpyPrimitives, NumpyNNKernels, NumpyOptimKernels):
    """The reference backend: NumPy arrays on the CPU (bfloat16 accumulated in float32)."""

    name = "numpy"
    device = "cpu"

    def executor(self, plan: Any, roots: dict[int, Any], objects: list[Any]) -> CpuReplay:
        """A compiled plan bound to host memory, replayed as a loop of pre-bound calls."""
        return CpuReplay(plan, self, roots, objects)

    def async_stream(self) -> None:
        """None: asynchronous compiled calls on the CPU run on a worker thread."""
        return None

    def collective_(self, dst: Any, src: Any, communicator: Any, op: str, reduce: str = "sum", root: int = 0,
                    overlap: bool = False) -> None:
        """Hand the arrays to the communicator (it knows its devices' streams)."""
        communicator.run(op, dst, src, reduce=reduce, root=root, overlap=overlap)
