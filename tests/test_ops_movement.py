"""Shape and movement ops: reshape/view, transpose/permute, expand, squeeze/unsqueeze,
flatten, concatenate/stack, split/chunk, pad, flip, repeat."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tensorcore as tc
import tensorcore.functional as F
from op_harness import check_op, load_torch, shapes

torch = load_torch()
TF = torch.nn.functional if torch else None


@st.composite
def reshape_target(draw, shape):
    """A new shape with the same element count, maybe with one -1."""
    size = math.prod(shape)
    if size == 0:
        target = list(draw(st.permutations(shape))) if shape else [0]
    else:
        factors = [p for p in range(2, size + 1) if size % p == 0]
        target, rest = [], size
        while rest > 1 and len(target) < 4:
            f = draw(st.sampled_from([p for p in factors if rest % p == 0]))
            target.append(f)
            rest //= f
        if rest > 1:  # four factors drawn before the size was used up: the last takes the rest
            target[-1] *= rest
        target += [1] * draw(st.integers(0, 1))
        target = draw(st.permutations(target))
        if target and draw(st.booleans()):
            target[draw(st.integers(0, len(target) - 1))] = -1
    return tuple(target)


@pytest.mark.parametrize("method", ["reshape", "view"])
@given(data=st.data())
def test_reshape(backend, data, method):
    shape = data.draw(shapes())
    target = data.draw(reshape_target(shape))
    check_op(backend, data, lambda x: getattr(x, method)(*target), lambda x: x.reshape(target), [shape],
             torch_op=lambda x: x.reshape(target))


@given(data=st.data())
def test_permute(backend, data):
    shape = data.draw(shapes())
    order = tuple(data.draw(st.permutations(range(len(shape)))))
    check_op(backend, data, lambda x: [x.permute(*order), tc.permute(x, order)], lambda x: [x.transpose(order)] * 2,
             [shape], torch_op=lambda x: [x.permute(order)] * 2)


@given(data=st.data())
def test_transpose_and_T(backend, data):
    shape = data.draw(shapes(min_dims=2))
    d0, d1 = data.draw(st.integers(-len(shape), len(shape) - 1)), data.draw(st.integers(-len(shape), len(shape) - 1))
    check_op(backend, data, lambda x: [x.transpose(d0, d1), x.T, tc.transpose(x, d0, d1)],
             lambda x: [np.swapaxes(x, d0, d1), x.transpose(), np.swapaxes(x, d0, d1)], [shape],
             torch_op=lambda x: [x.transpose(d0, d1), x.permute(*reversed(range(x.ndim))), x.transpose(d0, d1)])


@given(data=st.data())
def test_expand(backend, data):
    shape = data.draw(shapes(max_dims=3, min_side=1))
    lead = data.draw(st.lists(st.integers(0, 3), max_size=2))
    target = tuple(lead) + tuple(data.draw(st.sampled_from([n, -1] if n != 1 else [1, 3, -1])) for n in shape)
    full = tuple(lead) + tuple(n if t == -1 else t for n, t in zip(shape, target[len(lead):]))
    check_op(backend, data, lambda x: [x.expand(*target), x.expand_as(tc.zeros(full))],
             lambda x: [np.broadcast_to(x, full)] * 2, [shape],
             torch_op=lambda x: [x.expand(target), x.expand_as(torch.zeros(full))])


@given(data=st.data())
def test_squeeze_unsqueeze(backend, data):
    shape = data.draw(shapes(max_side=2))
    ones = [i for i, n in enumerate(shape) if n == 1]
    axis = data.draw(st.sampled_from(ones)) if ones else None
    new = data.draw(st.integers(-len(shape) - 1, len(shape)))

    def op(x):
        return [x.squeeze(), x.squeeze(axis), x.unsqueeze(new), tc.squeeze(tc.unsqueeze(x, new), new)]

    def ref(x):
        return [np.squeeze(x), np.squeeze(x, axis), np.expand_dims(x, new), x]

    def torch_op(x):
        return [x.squeeze(), x.squeeze() if axis is None else x.squeeze(axis), x.unsqueeze(new), x]
    check_op(backend, data, op, ref, [shape], torch_op=torch_op)


@given(data=st.data())
def test_flatten(backend, data):
    shape = data.draw(shapes(min_dims=1))
    start = data.draw(st.integers(0, len(shape) - 1))
    end = data.draw(st.integers(start, len(shape) - 1))
    target = shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:]
    check_op(backend, data, lambda x: [x.flatten(), x.flatten(start, end), tc.flatten(x, start, end)],
             lambda x: [x.reshape(-1), x.reshape(target), x.reshape(target)], [shape],
             torch_op=lambda x: [x.flatten(), x.flatten(start, end), x.flatten(start, end)])


@st.composite
def same_but_axis(draw, count):
    """``count`` shapes equal except along one axis; returns (shapes, axis)."""
    base = list(draw(shapes(min_dims=1, max_dims=3)))
    axis = draw(st.integers(-len(base), len(base) - 1))
    sizes = draw(st.lists(st.integers(0, 3), min_size=count, max_size=count))
    return [tuple(base[:axis % len(base)] + [n] + base[axis % len(base) + 1:]) for n in sizes], axis


@given(data=st.data())
def test_concatenate(backend, data):
    parts, axis = data.draw(same_but_axis(data.draw(st.integers(1, 3))))
    check_op(backend, data, lambda *xs: tc.cat(list(xs), axis), lambda *xs: np.concatenate(xs, axis), parts,
             torch_op=lambda *xs: torch.cat(xs, axis))


def test_concatenate_promotes_dtypes(backend):
    out = tc.concatenate([tc.tensor([1, 2], dtype=tc.int32), tc.tensor([0.5], dtype=tc.float64)])
    assert out.dtype == tc.float64
    np.testing.assert_array_equal(out.numpy(), [1, 2, 0.5])


@given(data=st.data())
def test_stack(backend, data):
    shape = data.draw(shapes(max_dims=3))
    count = data.draw(st.integers(1, 3))
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    check_op(backend, data, lambda *xs: tc.stack(xs, axis), lambda *xs: np.stack(xs, axis), [shape] * count,
             torch_op=lambda *xs: torch.stack(xs, axis))


@given(data=st.data())
def test_split_and_chunk(backend, data):
    shape = data.draw(shapes(min_dims=1, min_side=1, max_side=5))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    size = data.draw(st.integers(1, n + 1))
    chunks = data.draw(st.integers(1, n + 1))
    sections = data.draw(st.lists(st.integers(0, n), min_size=1, max_size=3).map(sorted))
    sizes = [b - a for a, b in zip([0] + sections, sections + [n])]

    def ref(x):
        step = -(-n // chunks)
        return (np.split(x, list(range(size, n, size)), axis) + np.split(x, list(range(step, n, step)), axis)
                + np.split(x, sections, axis))

    def torch_op(x):
        return list(x.split(size, axis)) + list(x.chunk(chunks, axis)) + list(x.split(sizes, axis))
    check_op(backend, data, lambda x: x.split(size, axis) + x.chunk(chunks, axis) + tc.split(x, sizes, axis), ref,
             [shape], torch_op=torch_op)


@given(data=st.data(), value=st.sampled_from([0.0, -1.5]))
def test_pad(backend, data, value):
    shape = data.draw(shapes(min_dims=1))
    pads = data.draw(st.lists(st.integers(0, 2), min_size=2, max_size=2 * len(shape)).filter(lambda p: len(p) % 2 == 0))
    widths = [(0, 0)] * (len(shape) - len(pads) // 2) + [(pads[2 * i], pads[2 * i + 1]) for i in reversed(range(len(pads) // 2))]
    check_op(backend, data, lambda x: F.pad(x, pads, value), lambda x: np.pad(x, widths, constant_values=value), [shape],
             torch_op=lambda x: TF.pad(x, pads, value=value))


@given(data=st.data())
def test_flip(backend, data):
    shape = data.draw(shapes(min_dims=1))
    dims = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True))
    check_op(backend, data, lambda x: x.flip(dims), lambda x: np.flip(x, dims), [shape],
             torch_op=lambda x: x.flip(dims))


@given(data=st.data())
def test_repeat(backend, data):
    shape = data.draw(shapes(max_dims=3))
    repeats = data.draw(st.lists(st.integers(0, 3), min_size=len(shape), max_size=len(shape) + 2))

    def ref(x):
        return np.tile(x.reshape((1,) * (len(repeats) - x.ndim) + x.shape), repeats)
    check_op(backend, data, lambda x: x.repeat(*repeats), ref, [shape], torch_op=lambda x: x.repeat(tuple(repeats)))


@given(data=st.data())
def test_clone_contiguous_casts_and_moves(backend, data):
    shape = data.draw(shapes())
    check_op(backend, data, lambda x: [x.clone(), x.contiguous(), x.double().to(x.dtype), x.to("cpu")],
             lambda x: [x, x, x, x], [shape], torch_op=lambda x: [x.clone(), x.contiguous(), x.double(), x.cpu()])
