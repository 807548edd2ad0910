"""Indexing: ``x[index]`` with slices, ints, None, ellipsis, integer and bool arrays
(gather forward, scatter-add backward) and ``x[index] = value``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tensorcore as tc
from op_harness import check_op, load_torch, shapes

torch = load_torch()


@st.composite
def basic_index(draw, shape):
    """A tuple of slices (any step), in-range ints, None and at most one Ellipsis."""
    index, dims = [], list(shape)
    while dims and draw(st.booleans()):
        n = dims.pop(0)
        kind = draw(st.sampled_from(["slice", "int", "none"] if n else ["slice", "none"]))
        if kind == "int":
            index.append(draw(st.integers(-n, n - 1)))
        elif kind == "none":
            index.append(None)
            dims.insert(0, n)
        else:
            start, stop = draw(st.integers(-n - 1, n + 1)), draw(st.integers(-n - 1, n + 1))
            index.append(slice(draw(st.none() | st.just(start)), draw(st.none() | st.just(stop)),
                               draw(st.sampled_from([None, 1, 2, 3]))))
    if draw(st.booleans()):  # stands for the dims left over, so it may go anywhere once none are
        index.insert(len(index) if dims else draw(st.integers(0, len(index))), Ellipsis)
    return tuple(index)


def _torch_index(index):
    """The index with its NumPy arrays as torch tensors."""
    return tuple(torch.from_numpy(i) if isinstance(i, np.ndarray) else i for i in index)


@given(data=st.data())
def test_basic_indexing(backend, data):
    shape = data.draw(shapes())
    index = data.draw(basic_index(shape))
    fn = lambda x: x[index]  # noqa: E731
    check_op(backend, data, fn, fn, [shape], torch_op=fn)


@given(data=st.data())
def test_negative_step_slices(backend, data):
    shape = data.draw(shapes(min_dims=1))
    step = data.draw(st.sampled_from([-1, -2]))
    fn = lambda x: x[..., ::step]  # noqa: E731
    check_op(backend, data, fn, fn, [shape], torch_op=lambda x: x.flip(-1)[..., ::-step])


@st.composite
def gather_index(draw, shape):
    """Integer arrays (with repeats, negatives) on one or two axes, mixed with slices."""
    first = draw(st.integers(0, len(shape) - 1))
    count = draw(st.integers(1, min(2, len(shape) - first)))
    idx_shape = draw(shapes(max_dims=2, min_side=1, max_side=3))
    arrays = [np.array(draw(st.lists(st.integers(-n, n - 1), min_size=int(np.prod(idx_shape)),
                                     max_size=int(np.prod(idx_shape))))).reshape(idx_shape).astype(np.int64)
              for n in shape[first:first + count]]
    return (slice(None),) * first + tuple(arrays)


@given(data=st.data(), as_tensor=st.booleans())
def test_integer_array_indexing(backend, data, as_tensor):
    shape = data.draw(shapes(min_dims=1, min_side=1))
    index = data.draw(gather_index(shape))
    # CPU index tensors serve tensors on every device (as in PyTorch)
    tc_index = tuple((tc.tensor(i, device="cpu") if as_tensor else i.tolist()) if isinstance(i, np.ndarray) else i
                     for i in index)
    check_op(backend, data, lambda x: x[tc_index], lambda x: x[index], [shape],
             torch_op=lambda x: x[_torch_index(index)])


def test_gather_backward_accumulates_repeats(backend):
    x = tc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x[tc.tensor([0, 2, 0, 0])].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 0.0, 1.0])


@given(data=st.data())
def test_bool_mask_indexing(backend, data):
    shape = data.draw(shapes(min_dims=1, max_dims=3))
    mask = np.asarray(data.draw(st.lists(st.booleans(), min_size=shape[0], max_size=shape[0])), dtype=bool)
    check_op(backend, data, lambda x, m: x[m], lambda x, m: x[m], [shape, mask], torch_op=lambda x, m: x[m])


@given(data=st.data())
def test_setitem(backend, data):
    shape = data.draw(shapes(min_dims=1))
    index = data.draw(basic_index(shape))
    value_shape = np.empty(shape)[index].shape
    value_shape = value_shape[data.draw(st.integers(0, len(value_shape))):]  # broadcast from a suffix

    def op(x, v):
        y = x * 1.0  # a non-leaf copy that may be written in place
        y[index] = v
        return y

    def ref(x, v):
        y = x.copy()
        y[index] = v
        return y
    check_op(backend, data, op, ref, [shape, value_shape], torch_op=op)


@given(data=st.data())
def test_setitem_with_integer_arrays(backend, data):
    shape = data.draw(shapes(min_dims=1, min_side=1))
    n = shape[0]
    rows = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)), dtype=np.int64)

    def op(x, v, i):
        y = x * 1.0
        y[i] = v
        return y

    def ref(x, v, i):
        y = x.copy()
        y[i] = v
        return y
    check_op(backend, data, op, ref, [shape, (len(rows),) + shape[1:], rows], torch_op=op)


def test_setitem_without_grad_writes_in_place(backend):
    x = tc.zeros(2, 3)
    x[0, 1:] = 5.0
    x[:, 0] = tc.tensor([1.0, 2.0])
    np.testing.assert_array_equal(x.numpy(), [[1, 5, 5], [2, 0, 0]])


def test_iteration_and_len(backend):
    x = tc.arange(6).reshape(3, 2)
    assert len(x) == 3
    assert [row.tolist() for row in x] == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.parametrize("index", [(0, 0, 0), (5,), (-6,)])
def test_out_of_range_raises_index_error(backend, index):
    x = tc.zeros(5, 2)
    with pytest.raises(IndexError, match="getitem"):
        x[index]
