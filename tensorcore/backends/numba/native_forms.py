"""The native forms of the Numba backend's calls, for native plans (``native_plan.py``).

``native(op, args, kwargs, out)`` answers, for one bound step of a compiled plan, the
jitted calls the eager method runs for those arguments -- the same kernels with the
same arguments, on as many threads -- writing the step's result into ``out`` (its
planned buffer; None for in-place ops), or None when the step has no native form and
stays a Python call.  Native forms, by op:

* ``matmul``: NumPy's own ``cblas_?gemm`` call (``blas.py``), 2-D float operands;
* ``matmul_bias_act``: that product, then the in-place bias + activation kernel;
* ``unary`` of an activation, ``activation_grad``: the activation kernels;
* ``unary`` / ``binary`` of the ops the fused loops compute bit for bit as NumPy
  (``NumbaFusedKernels.fused_unary`` / ``fused_binary``), ``add_``, ``copy_``,
  ``fused_elementwise``: a generated fused loop (``fused.py``) of one op or the program;
* ``reduce`` (sum) of a C-contiguous array over all its axes or its leading ones:
  NumPy's order of additions (``numpy_sums.py``), or the channel-sums kernel where the
  eager method takes it;
* ``concatenate``: one copy per input; ``copy_``, ``setitem_`` of a whole array and a
  ``reshape`` that copies: a copy;
* ``group_norm`` / ``group_norm_backward``: the norm kernels;
* ``adam_update_`` / ``sgd_update_``: the optimizer kernels.

Every form applies the conditions under which the eager method takes that path (float32
or float64 arrays of one dtype, contiguous where the kernel reshapes); other calls --
convolutions, norms, other reductions, anything else -- have none.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import fused_program
from ..numpy.act import check_activation
from .kernels import fast_path
from .native_plan import Literal, NativeCall, copy_call, gemm_call, kernel_call
from .nn import _FUSED_UNARY
from .optim import _flat as _flat_buffers

Array = Any
Calls = list[NativeCall] | None


def _contiguous(*arrays: Array) -> bool:
    return all(a.flags.c_contiguous for a in arrays)


def _buffers(out: tuple, shapes: tuple, dtype: Any) -> tuple:
    """The arrays a kernel writes a tuple result into: each item's planned buffer seen
    in the kernel's ``shapes``, a buffer made now (and bound with the call) for an item
    the plan keeps nothing of."""
    out = tuple(out) + (None,) * (len(shapes) - len(out))
    return tuple(np.empty(shape, dtype) if b is None else b.reshape(shape) for b, shape in zip(out, shapes))


def _code(act: str) -> Literal:
    from .kernels import activations as K

    return Literal(int(K.ACT_CODES[act]))


class NumbaNativeForms:
    """``native``: a bound step's calls as jitted code (see the module docstring)."""

    def native(self, op: str, args: tuple, kwargs: dict, out: Array | None) -> Calls:
        """The jitted calls of ``getattr(self, op)(*args, **kwargs)`` writing into ``out``, or None."""
        form: Callable[..., Calls] | None = _FORMS.get(op)
        buffers = out if isinstance(out, tuple) else (out,)
        if form is None or not all(b is None or (isinstance(b, np.ndarray) and b.flags.c_contiguous) for b in buffers):
            return None
        try:
            return form(self, out, *args, **kwargs)
        except (TypeError, ValueError):  # arguments the eager call rejects: it raises them on replay
            return None

    def _native_matmul(self, out: Array, a: Array, b: Array) -> Calls:
        if out is None or not fast_path(a, b, out):
            return None
        call = gemm_call(a, b, out)
        return None if call is None else [call]

    def _native_matmul_bias_act(self, out: Array, a: Array, b: Array, bias: Array | None, act: str,
                                residual: Array | None = None) -> Calls:
        from .kernels import activations as K

        check_activation("matmul_bias_act", act)
        if out is None or bias is None or not fast_path(a, b, bias, out):
            return None
        product = gemm_call(a, b, out)
        if product is None:
            return None
        self._bias_layout("matmul_bias_act", out, bias, -1)
        calls = [product, kernel_call(K.bias_act_rows_, out.reshape(-1, out.shape[-1]), bias, _code(act))]
        if residual is None:
            return calls
        skip = self._native_binary(out, "add", out, residual)  # as the eager add after the product
        return None if skip is None else calls + skip

    def _native_unary(self, out: Array, op: str, a: Array) -> Calls:
        if out is None:
            return None
        if op in _FUSED_UNARY:
            from .kernels import activations as K

            if not fast_path(a, out) or not _contiguous(a) or a.shape != out.shape:
                return None
            return [kernel_call(K.act_forward_flat, a.reshape(-1), _code(op), into=out.reshape(-1))]
        if op not in self.fused_unary or not isinstance(a, np.ndarray):
            return None
        return self._one_op_loop(out, ("unary", op), [a])

    def _native_binary(self, out: Array, op: str, a: Any, b: Any) -> Calls:
        if out is None or op not in self.fused_binary:
            return None
        return self._one_op_loop(out, ("binary", op), [a, b])

    def _native_add_(self, out: None, dst: Array, src: Any) -> Calls:
        return self._one_op_loop(dst, ("binary", "add"), [dst, src])

    def _native_copy_(self, out: None, dst: Array, src: Array) -> Calls:
        if not (isinstance(src, np.ndarray) and src.dtype == dst.dtype and src.shape == dst.shape):
            return None
        return [copy_call(dst, src)]

    def _native_setitem_(self, out: None, a: Array, index: Any, value: Any) -> Calls:
        if index is not Ellipsis and index != (Ellipsis,):
            return None
        return self._native_copy_(None, a, value)

    def _native_reshape(self, out: Array, a: Array, shape: Any) -> Calls:
        """A reshape that copies (of a non-contiguous view): the values in C order."""
        if out is None or not isinstance(a, np.ndarray) or a.dtype != out.dtype or a.size != out.size:
            return None
        return [copy_call(out.reshape(a.shape), a)]

    def _one_op_loop(self, out: Array, instruction: tuple, operands: list[Any]) -> Calls:
        """``out`` = one unary or binary op of ``operands`` (arrays of ``out``'s float dtype,
        numbers) as a fused loop: what NumPy's ufunc computes, a Python number taking the
        array's dtype as NumPy 2's promotion gives it."""
        if not (isinstance(out, np.ndarray) and out.flags.c_contiguous and out.size) \
                or out.dtype.name not in fused_program.FLOATS:
            return None
        dtype = out.dtype.name
        inputs, registers, code = [], [], []
        for x in operands:
            if isinstance(x, np.ndarray) and x.dtype == out.dtype:
                registers.append(("input", len(inputs)))
                inputs.append(x)
            elif type(x) is float or (type(x) is int and abs(x) < 2 ** 24):  # exact in float32 too
                registers.append(("const", x))
            else:
                return None
        if not inputs or np.broadcast_shapes(*[x.shape for x in inputs]) != out.shape:
            return None
        numbers = []
        for kind, value in registers:
            if kind == "const":
                code.append(("const", dtype, float(value)))
                numbers.append(len(inputs) + len(code) - 1)
            else:
                numbers.append(value)
        code.append((*instruction, *numbers))
        program = ((dtype,) * len(inputs), tuple(code))
        if fused_program.check(program)[-1] != dtype:
            return None
        return self._native_fused_elementwise(out, program, inputs)

    def _native_fused_elementwise(self, out: Array, program: tuple, inputs: Any) -> Calls:
        from . import fused

        if out is None or not out.size:
            return None
        fused_program.check(program, [a.dtype.name for a in inputs])
        name, kernel, arguments, sized = fused.loop_call(program, inputs, out)
        if not sized:
            return [NativeCall(name, kernel, arguments)]
        from . import threads

        return [NativeCall(name, kernel, arguments, parallel=not threads.runs_serially(arguments))]

    def _native_reduce(self, out: Array, op: str, a: Array, axes: Any, keepdims: bool) -> Calls:
        """The channel-sums kernel where ``reduce`` takes it, else NumPy's own order of
        additions (``numpy_sums.py``) for a sum of a C-contiguous array over all its axes
        or its leading ones."""
        from . import numpy_sums
        from .nn import sum_path

        if out is None or op != "sum" or not fast_path(a, out) or not a.flags.c_contiguous or not a.size:
            return None
        summed = set(range(a.ndim)) if axes is None else {ax % a.ndim for ax in axes}
        if axes is not None and len(summed) != len(axes):
            return None
        kept = [ax for ax in range(a.ndim) if ax not in summed]
        path = sum_path(op, a, axes)
        if path is not None and path[0] == "channels":  # NumbaNNKernels.reduce's channel sums
            from .kernels.reductions import channel_sums

            return [kernel_call(channel_sums, a.reshape(path[1]), into=out.reshape(-1))]
        if isinstance(axes, tuple) and len(axes) > 1 and min(axes) == 0 and a.ndim > 2:
            return None  # the reference adds slabs first (NumpyBackend.reduce)
        width = int(np.prod([a.shape[ax] for ax in kept]))
        if width == 1:
            return [NativeCall("numpy_sums_full_sum", numpy_sums.full_sum, (a.reshape(-1), out.reshape(1)))]
        if summed != set(range(len(summed))):
            return None
        return [NativeCall("numpy_sums_leading_sum", numpy_sums.leading_sum, (a.reshape(-1, width), out.reshape(-1)))]

    def _native_activation_grad(self, out: Array, act: str, x: Array, grad: Array) -> Calls:
        from .kernels import activations as K

        check_activation("activation_grad", act)
        if out is None or not fast_path(x, grad, out) or x.shape != grad.shape or not _contiguous(x, grad):
            return None
        return [kernel_call(K.act_backward_flat, x.reshape(-1), grad.reshape(-1), _code(act), into=out.reshape(-1))]

    def _native_concatenate(self, made: Array | None, arrays: Any, axis: int, out: Array | None = None) -> Calls:
        out = made if out is None else out
        if not isinstance(out, np.ndarray) or not all(isinstance(a, np.ndarray) and a.dtype == out.dtype
                                                      for a in arrays):
            return None
        axis %= out.ndim
        calls, start = [], 0
        for a in arrays:
            stop = start + a.shape[axis]
            part = out[(slice(None),) * axis + (slice(start, stop),)]
            if part.shape != a.shape:
                return None
            calls.append(copy_call(part, a))
            start = stop
        return calls if start == out.shape[axis] else None

    def _native_group_norm(self, out: Any, x: Array, weight: Array | None, bias: Array | None, groups: int,
                           eps: float, act: str = "none", shift: Array | None = None) -> Calls:
        from .kernels import norms as K

        check_activation("group_norm", act)
        if not isinstance(out, tuple) or not fast_path(x, weight, bias, shift) or not x.size or not _contiguous(x):
            return None
        blocks = self._group_blocks("group_norm", x, groups)
        for name, p in (("weight", weight), ("bias", bias)):
            self._check_param("group_norm", name, p, x.shape[1:2])
        if shift is not None:
            shift = self._shift_planes("group_norm", x, shift)
            if not _contiguous(shift):
                return None
            shift = shift.reshape(x.shape[:2])
        w, b = self._affine_params(weight, bias, x.shape[1], x.dtype)
        y, mean, rstd = _buffers(out, (blocks.shape, blocks.shape[:2], blocks.shape[:2]), x.dtype)
        return [kernel_call(K.group_norm_groups, blocks, w, b, float(eps), _code(act), shift, y, mean, rstd)]

    def _native_group_norm_backward(self, out: Any, grad: Array, x: Array, weight: Array | None,
                                    bias: Array | None, mean: Array, rstd: Array, groups: int,
                                    act: str = "none") -> Calls:
        from .kernels import norms as K

        check_activation("group_norm_backward", act)
        if (not isinstance(out, tuple) or not fast_path(grad, x, weight, bias, mean, rstd) or not x.size
                or grad.shape != x.shape or not _contiguous(grad, x, mean, rstd)):
            return None
        blocks = self._group_blocks("group_norm_backward", x, groups)
        w, b = self._affine_params(weight, bias, x.shape[1], x.dtype)
        dx, dw, db = _buffers(out, (blocks.shape, (x.shape[1],), (x.shape[1],)), x.dtype)
        return [kernel_call(K.group_norm_groups_backward, grad.reshape(blocks.shape), blocks, w, b,
                            mean.reshape(blocks.shape[:2]), rstd.reshape(blocks.shape[:2]), _code(act),
                            dx, dw, db)]

    def _native_adam_update_(self, out: None, p: Array, g: Array, m: Array, v: Array, vmax: Array | None,
                             lr: Array, step: Array, beta1: float, beta2: float, eps: float,
                             weight_decay: float, decoupled: bool) -> Calls:
        from .kernels import optim as K

        if not _flat_buffers(p, g, m, v, vmax):
            return None
        return [kernel_call(K.adam, p, g, m, v, vmax, lr, step, float(beta1), float(beta2), float(eps),
                            float(weight_decay), bool(decoupled))]

    def _native_sgd_update_(self, out: None, p: Array, g: Array, buf: Array | None, lr: Array, momentum: float,
                            dampening: float, nesterov: bool, weight_decay: float, first_step: Array) -> Calls:
        from .kernels import optim as K

        if not _flat_buffers(p, g, buf):
            return None
        return [kernel_call(K.sgd, p, g, buf if momentum != 0 else None, lr, float(momentum), float(dampening),
                            bool(nesterov), float(weight_decay), first_step)]


_FORMS: dict[str, Callable[..., Calls]] = {name[len("_native_"):]: method for name, method in vars(NumbaNativeForms).items()
                                           if name.startswith("_native_")}
