"""``check_op``: the one property check every op of the engine goes through.

A test draws the shapes and static arguments of an op with the strategies below, then
calls ``check_op``, which draws the input values and memory layouts and checks

1. the forward on the NumPy backend in float64 against a float64 NumPy reference;
2. the gradients against central differences (NumPy backend, float64);
3. the forward and gradients on the backend under test, in float32, against 1 and 2;
4. when torch is importable, the forward and gradients against torch in float64;

and that no run modified its inputs.  Inputs are given as shapes (float inputs with
drawn values, differentiated) or as fixed arrays (integer targets, bool masks, or
floats with chosen values).  Outputs may be one tensor or a list of tensors.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, Callable, Sequence

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tensorcore as tc

Shape = tuple[int, ...]
Input = Shape | np.ndarray
LAYOUTS = ("contiguous", "permuted", "flipped", "strided")
EPS = 1e-6  # central-difference step in float64
MAX_COORDS = 24  # gradient coordinates checked numerically per input


# ----- strategies ------------------------------------------------------------------------
def shapes(min_dims: int = 0, max_dims: int = 4, min_side: int = 0, max_side: int = 4) -> st.SearchStrategy[Shape]:
    """Array shapes, including size-1 and (when min_side is 0) empty dims."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def broadcast_shapes(n: int = 2, min_dims: int = 0, max_dims: int = 4, min_side: int = 0,
                     max_side: int = 4) -> st.SearchStrategy[tuple[Shape, ...]]:
    """``n`` shapes that broadcast together (size-1 and missing leading dims included)."""
    return hnp.mutually_broadcastable_shapes(num_shapes=n, min_dims=min_dims, max_dims=max_dims,
                                             min_side=min_side, max_side=max_side).map(lambda s: s.input_shapes)


def axes(ndim: int) -> st.SearchStrategy[int | tuple[int, ...] | None]:
    """None, one axis (maybe negative) or a non-empty tuple of distinct axes."""
    if ndim == 0:
        return st.none()
    one = st.integers(-ndim, ndim - 1)
    many = st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True).map(tuple)
    return st.one_of(st.none(), one, many)


# ----- torch ----------------------------------------------------------------------------
@functools.cache
def load_torch() -> ModuleType | None:
    """The torch module when it is importable, else None (torch is an optional oracle)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


# ----- the check --------------------------------------------------------------------------
def check_op(backend: str, data: st.DataObject, op: Callable[..., Any], ref: Callable[..., Any],
             inputs: Sequence[Input], *, torch_op: Callable[..., Any] | None = None,
             wrt: Sequence[int] | None = None, low: float = -2.0, high: float = 2.0,
             integer_values: bool = False, tol: float = 1e-7, grad_tol: float = 1e-5,
             tol32: float = 2e-4) -> None:
    """Check ``op`` (tensors -> tensor or list) against ``ref`` (float64 arrays -> arrays).

    ``inputs``: a shape draws a float input uniform in [low, high] (integers there when
    ``integer_values``); an array is used as given.  ``wrt``: the positions whose
    gradients are checked (default: every float input).  ``torch_op`` takes torch
    tensors; without it, no torch comparison is made.  ``tol``, ``grad_tol`` and
    ``tol32`` bound the float64 forward, the gradient and the float32 errors.
    """
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    values = [_values(rng, spec, low, high, integer_values) for spec in inputs]
    if wrt is None:
        wrt = [i for i, v in enumerate(values) if v.dtype.kind == "f"]
    layouts = [data.draw(st.sampled_from(LAYOUTS), label=f"layout of input {i}") for i in range(len(values))]

    want = _as_list(ref(*values))
    with tc.use_backend("numpy"):
        got, grads, cotangents = _run(op, values, layouts, wrt, np.float64, rng, cotangents=None)
    _compare(got, want, tol, "float64 forward vs reference")
    if any(o.dtype.kind == "f" for o in want) and wrt:
        _check_numerical_grads(op, values, wrt, grads, cotangents, rng, grad_tol)

    with tc.use_backend(backend):
        got32, grads32, _ = _run(op, values, layouts, wrt, np.float32, rng, cotangents)
    _compare(got32, got, tol32, f"float32 forward on {backend} vs float64 numpy")
    _compare(grads32, grads, tol32, f"float32 gradients on {backend} vs float64 numpy")

    torch = load_torch()
    if torch is not None and torch_op is not None:
        _check_torch(torch, torch_op, values, wrt, want, grads, cotangents, tol, grad_tol)


def _values(rng: np.random.Generator, spec: Input, low: float, high: float, integer_values: bool) -> np.ndarray:
    if isinstance(spec, np.ndarray):
        return spec
    if integer_values:
        return rng.integers(int(low), int(high) + 1, size=spec).astype(np.float64)
    return rng.uniform(low, high, size=spec)


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, list | tuple) else [out]


def _tensor(value: np.ndarray, layout: str, dtype: Any, requires_grad: bool) -> tc.Tensor:
    """``value`` as a tensor on the default device, stored in the given memory layout."""
    if value.dtype.kind == "f":
        value = value.astype(dtype)
    if value.ndim == 0 or layout == "contiguous":
        t = tc.tensor(value)
    elif layout == "permuted":  # stored transposed, viewed back through a permutation
        order = np.roll(np.arange(value.ndim), 1)
        t = tc.tensor(np.ascontiguousarray(value.transpose(order))).permute(*np.argsort(order).tolist())
    elif layout == "flipped":  # negative strides
        t = tc.tensor(np.ascontiguousarray(np.flip(value))).flip(tuple(range(value.ndim)))
    else:  # every other element of a buffer twice as long in the last axis
        padded = np.zeros(value.shape[:-1] + (2 * value.shape[-1],), value.dtype)
        padded[..., ::2] = value
        t = tc.tensor(padded)[..., ::2]
    t = t.detach()
    assert t.shape == value.shape and np.array_equal(t.numpy(), value, equal_nan=True)
    return t.requires_grad_() if requires_grad else t


def _run(op: Callable[..., Any], values: list[np.ndarray], layouts: list[str], wrt: Sequence[int],
         dtype: Any, rng: np.random.Generator, cotangents: list[np.ndarray] | None
         ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Forward and backward of op on the current backend; returns (outputs, grads, cotangents)."""
    tensors = [_tensor(v, layout, dtype, i in wrt) for i, (v, layout) in enumerate(zip(values, layouts))]
    before = [t.numpy().copy() for t in tensors]
    outs = _as_list(op(*tensors))
    for out in outs:
        expected = dtype if out.dtype.kind == "f" else out.dtype
        assert out.dtype == expected, f"output dtype {out.dtype}, expected {np.dtype(expected)}"
    float_outs = [o for o in outs if o.dtype.kind == "f"]
    if cotangents is None:
        cotangents = [rng.standard_normal(o.shape) for o in float_outs]
    grads: list[np.ndarray] = []
    if wrt and float_outs:
        _backward(float_outs, [tc.tensor(c.astype(dtype), device=o.device) for c, o in zip(cotangents, float_outs)])
        for i in wrt:
            grad = tensors[i].grad
            grads.append(np.zeros(values[i].shape) if grad is None else grad.numpy())
            assert grad is None or (grad.shape == tensors[i].shape and grad.dtype == tensors[i].dtype), \
                f"gradient of input {i}: {grad.shape} {grad.dtype} for a {tensors[i].shape} {tensors[i].dtype} input"
    for i, (t, b) in enumerate(zip(tensors, before)):
        assert np.array_equal(t.numpy(), b, equal_nan=True), f"the op modified its input {i}"
    return [o.numpy() for o in outs], grads, cotangents


def _backward(outs: list[tc.Tensor], cotangents: list[tc.Tensor]) -> None:
    """Backpropagate sum_i <out_i, cotangent_i>: one backward per output (outputs may sit on
    different devices), gradients accumulating in the inputs."""
    for out, cotangent in zip(outs, cotangents):
        if out.requires_grad:
            out.backward(cotangent)


def _check_numerical_grads(op: Callable[..., Any], values: list[np.ndarray], wrt: Sequence[int],
                           grads: list[np.ndarray], cotangents: list[np.ndarray],
                           rng: np.random.Generator, grad_tol: float) -> None:
    """Central differences of <op(values), cotangents> at up to MAX_COORDS coordinates per input."""
    def objective(vals: list[np.ndarray]) -> float:
        with tc.use_backend("numpy"), tc.no_grad():
            outs = [o for o in _as_list(op(*[tc.tensor(v) for v in vals])) if o.dtype.kind == "f"]
            return float(sum(np.sum(o.numpy() * c) for o, c in zip(outs, cotangents)))

    for i, grad in zip(wrt, grads):
        size = values[i].size
        coords = rng.choice(size, min(size, MAX_COORDS), replace=False) if size else []
        for flat in coords:
            numeric = []
            for step in (EPS, -EPS):
                shifted = [v.copy() for v in values]
                shifted[i].reshape(-1)[flat] += step
                numeric.append(objective(shifted))
            estimate = (numeric[0] - numeric[1]) / (2 * EPS)
            analytic = grad.reshape(-1)[flat]
            assert abs(analytic - estimate) <= grad_tol * max(1.0, abs(estimate)), \
                f"gradient of input {i} at flat index {flat}: analytic {analytic}, central difference {estimate}"


def _check_torch(torch: ModuleType, torch_op: Callable[..., Any], values: list[np.ndarray], wrt: Sequence[int],
                 want: list[np.ndarray], grads: list[np.ndarray], cotangents: list[np.ndarray],
                 tol: float, grad_tol: float) -> None:
    tensors = [torch.tensor(v, requires_grad=i in wrt) for i, v in enumerate(values)]
    outs = _as_list(torch_op(*tensors))
    _compare([o.detach().numpy() for o in outs], want, tol, "torch forward vs reference")
    pairs = [(o, torch.tensor(c)) for o, c in zip([o for o in outs if o.is_floating_point()], cotangents)
             if o.requires_grad]
    if not grads or not pairs:
        return
    torch.autograd.backward([o for o, _ in pairs], [c for _, c in pairs])
    torch_grads = [np.zeros(values[i].shape) if tensors[i].grad is None else tensors[i].grad.numpy() for i in wrt]
    _compare(grads, torch_grads, grad_tol, "float64 gradients vs torch")


def _compare(got: list[np.ndarray], want: list[np.ndarray], tol: float, what: str) -> None:
    """Same count, shapes and kinds; floats within tol (relative to the largest value), others exact."""
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"{what}: output {k} has shape {g.shape}, expected {w.shape}"
        if w.dtype.kind != "f":
            assert np.array_equal(g, w), f"{what}: output {k} differs:\n{g}\nexpected\n{w}"
            continue
        finite = np.abs(w[np.isfinite(w)])
        scale = max(1.0, float(finite.max())) if finite.size else 1.0
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale, err_msg=f"{what}: output {k}")
