"""Creation functions, dtypes and promotion, host interop, DLPack, and seeded randomness."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcore as tc
from op_harness import load_torch

torch = load_torch()
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


# ----- creation ------------------------------------------------------------------------
@pytest.mark.parametrize("make, expected", [
    (lambda: tc.zeros(2, 3), np.zeros((2, 3), np.float32)),
    (lambda: tc.zeros((2, 3), dtype=tc.int32), np.zeros((2, 3), np.int32)),
    (lambda: tc.ones(4, dtype=tc.float64), np.ones(4)),
    (lambda: tc.full((2, 2), 7), np.full((2, 2), 7, np.int64)),
    (lambda: tc.full(3, 0.5), np.full(3, 0.5, np.float32)),
    (lambda: tc.full((2,), True), np.full(2, True)),
    (lambda: tc.arange(5), np.arange(5, dtype=np.int64)),
    (lambda: tc.arange(1, 2, 0.25), np.arange(1, 2, 0.25, dtype=np.float32)),
    (lambda: tc.arange(5, 0, -2), np.arange(5, 0, -2, dtype=np.int64)),
    (lambda: tc.linspace(0, 1, 5), np.linspace(0, 1, 5, dtype=np.float32)),
    (lambda: tc.eye(3), np.eye(3, dtype=np.float32)),
    (lambda: tc.eye(2, 3, dtype=tc.int64), np.eye(2, 3, dtype=np.int64)),
    (lambda: tc.zeros(0, 3), np.zeros((0, 3), np.float32)),
    (lambda: tc.tensor([[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]], np.int64)),
    (lambda: tc.tensor([1.5, 2.0]), np.array([1.5, 2.0], np.float32)),
    (lambda: tc.tensor(3.0), np.array(3.0, np.float32)),
    (lambda: tc.tensor([True, False]), np.array([True, False])),
    (lambda: tc.tensor(np.arange(3, dtype=np.float64)), np.arange(3, dtype=np.float64)),
    (lambda: tc.tensor([1, 2], dtype=tc.float16), np.array([1, 2], np.float16)),
    (lambda: tc.tensor(tc.tensor([1.0, 2.0])), np.array([1.0, 2.0], np.float32)),
    (lambda: tc.as_tensor([1, 2], dtype=tc.float64), np.array([1.0, 2.0])),
])
def test_creation(backend, make, expected):
    out = make()
    assert out.dtype == expected.dtype and out.shape == expected.shape
    assert out.device == tc.get_backend().device
    np.testing.assert_array_equal(out.numpy(), expected)


def test_like_functions_follow_their_argument(backend):
    x = tc.tensor([[1, 2, 3]], dtype=tc.int32)
    for made, value in [(tc.zeros_like(x), 0), (tc.ones_like(x), 1), (tc.full_like(x, 5), 5)]:
        assert made.shape == (1, 3) and made.dtype == tc.int32
        np.testing.assert_array_equal(made.numpy(), value)
    assert tc.empty_like(x).shape == (1, 3)
    assert tc.zeros_like(x, dtype=tc.float64).dtype == tc.float64
    assert tc.empty(2, 0).shape == (2, 0)
    assert tc.ones(2, requires_grad=True).requires_grad


def test_as_tensor_returns_a_matching_tensor_unchanged(backend):
    x = tc.ones(3)
    assert tc.as_tensor(x) is x
    assert tc.as_tensor(x, dtype=tc.float64) is not x


def test_torch_style_dtype_aliases():
    assert (tc.float, tc.double, tc.half, tc.long, tc.int, tc.bool) == (
        tc.float32, tc.float64, tc.float16, tc.int64, tc.int32, tc.bool_)


# ----- dtypes and promotion (the full table is in test_promotion.py) ------------------------
@pytest.mark.parametrize("a, b, expected", [
    (tc.int32, tc.int64, tc.int64), (tc.int64, tc.float32, tc.float32), (tc.float16, tc.float32, tc.float32),
    (tc.float32, tc.float64, tc.float64), (tc.bool_, tc.int32, tc.int32), (tc.bool_, tc.float16, tc.float16),
    (tc.int32, tc.float16, tc.float16),
])
def test_tensor_tensor_promotion(backend, a, b, expected):
    """NumPy's where it agrees with PyTorch; a floating dtype wins over an integer one (PyTorch)."""
    x, y = tc.ones(2, dtype=a), tc.ones(2, dtype=b)
    assert (x + y).dtype == expected
    assert (y * x).dtype == expected


@pytest.mark.parametrize("dtype, scalar, expected", [
    (tc.float16, 2.5, tc.float16), (tc.float32, 2, tc.float32), (tc.int32, 2, tc.int32),
    (tc.int64, 2.5, tc.float32), (tc.int32, 0.5, tc.float32), (tc.bool_, 1, tc.int64),
])
def test_python_scalars_are_weak(backend, dtype, scalar, expected):
    """A Python scalar does not widen a tensor's dtype of its own kind; a float meeting an
    integer tensor is the default float dtype (PyTorch)."""
    out = tc.ones(2, dtype=dtype) * scalar
    assert out.dtype == expected
    np.testing.assert_array_equal(out.numpy(), np.ones(2) * scalar)


def test_true_division_of_integers_gives_floats(backend):
    assert (tc.tensor([1, 2]) / 2).dtype.kind == "f"


@pytest.mark.parametrize("dtype", [tc.float16, tc.float32, tc.float64, tc.int32, tc.int64, tc.bool_])
def test_casts(backend, dtype):
    x = tc.tensor([0.0, 1.0, 2.5])
    out = x.to(dtype)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.numpy(), np.array([0.0, 1.0, 2.5]).astype(dtype))
    assert x.type(dtype).dtype == dtype


def test_cast_methods(backend):
    x = tc.tensor([1.7, -1.2])
    assert x.double().dtype == tc.float64 and x.half().dtype == tc.float16 and x.float().dtype == tc.float32
    assert x.long().tolist() == [1, -1] and x.int().dtype == tc.int32
    assert x.bool().tolist() == [True, True]


# ----- host interop --------------------------------------------------------------------------
def test_numpy_item_tolist_and_array(backend):
    x = tc.tensor([[1.5, 2.0], [3.0, 4.0]], dtype=tc.float64)
    assert isinstance(x.numpy(), np.ndarray)
    np.testing.assert_array_equal(np.asarray(x), x.numpy())
    assert np.asarray(x, dtype=np.float32).dtype == np.float32
    assert x.tolist() == [[1.5, 2.0], [3.0, 4.0]]
    assert x[1, 0].item() == 3.0 and isinstance(x[1, 0].item(), float)
    assert tc.tensor([7]).item() == 7 and isinstance(tc.tensor([7]).item(), int)
    assert float(x[0, 0]) == 1.5 and int(x[1, 1]) == 4 and bool(x[0, 0])
    with pytest.raises(ValueError, match="item"):
        x.item()


def test_numpy_operands_mix_with_tensors(backend):
    x = tc.tensor([1.0, 2.0])
    assert isinstance(np.ones(2) + x, tc.Tensor)
    np.testing.assert_array_equal((np.ones(2) + x).numpy(), [2.0, 3.0])
    np.testing.assert_array_equal((x * [2.0, 3.0]).numpy(), [2.0, 6.0])


def test_from_numpy_shares_memory():
    array = np.zeros(3, np.float32)
    x = tc.from_numpy(array)
    array[1] = 5.0
    assert x.tolist() == [0.0, 5.0, 0.0]
    with pytest.raises(TypeError, match="from_numpy"):
        tc.from_numpy([1, 2])


def test_repr_shows_values_and_dtype(backend):
    text = repr(tc.tensor([1.0, 2.0], requires_grad=True))
    assert "1." in text and "float32" in text and "requires_grad=True" in text


# ----- DLPack --------------------------------------------------------------------------------
def test_dlpack_round_trip_with_numpy():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = tc.from_dlpack(array)
    array[0, 0] = 9.0  # zero-copy: the tensor sees the change
    assert x.shape == (2, 3) and x.dtype == tc.float32 and x.tolist()[0][0] == 9.0
    back = np.from_dlpack(x)
    back[1, 2] = -1.0
    assert x.tolist()[1][2] == -1.0
    assert x.__dlpack_device__()[0] == 1  # kDLCPU


@needs_torch
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "bool"])
def test_dlpack_round_trip_with_torch(dtype):
    source = torch.arange(6).reshape(2, 3).to(getattr(torch, dtype))
    x = tc.from_dlpack(source)
    assert x.dtype == np.dtype(dtype) and x.shape == (2, 3)
    np.testing.assert_array_equal(x.numpy(), source.numpy())
    back = torch.from_dlpack(x)
    assert back.dtype == source.dtype
    assert torch.equal(back, source)
    if dtype == "float32":  # both directions share memory
        source[0, 0] = 42.0
        assert x.tolist()[0][0] == 42.0 and back[0, 0].item() == 42.0


@needs_torch
def test_bfloat16_crosses_dlpack_both_ways_sharing_memory():
    x = tc.tensor([1.5, -2.25, 3.0]).bfloat16()
    theirs = torch.from_dlpack(x)
    assert theirs.dtype == torch.bfloat16 and theirs.tolist() == [1.5, -2.25, 3.0]
    theirs[0] = 7.0
    assert x.float().tolist() == [7.0, -2.25, 3.0]
    source = torch.tensor([[0.5, 1.0], [2.0, -4.0]], dtype=torch.bfloat16)
    mine = tc.from_dlpack(source)
    assert mine.dtype == tc.bfloat16 and mine.shape == (2, 2) and mine.float().tolist() == [[0.5, 1.0], [2.0, -4.0]]
    source[1, 1] = 8.0
    assert mine.float().tolist()[1][1] == 8.0
    strided = tc.from_dlpack(torch.arange(12, dtype=torch.bfloat16).reshape(3, 4).T)
    np.testing.assert_array_equal(strided.float().numpy(), np.arange(12.0).reshape(3, 4).T)


def test_bfloat16_dlpack_round_trip_through_tensorcore():
    x = tc.tensor([[1.0, 2.5], [-3.0, 0.125]]).bfloat16()
    y = tc.from_dlpack(x)
    assert y.dtype == tc.bfloat16 and y.numpy().tobytes() == x.numpy().tobytes()
    with tc.no_grad():
        y[0, 0] = 4.0
    assert x.float().tolist()[0][0] == 4.0


class _Producer:
    """A CPU DLPack producer whose capsule carries a chosen type code (DLPack's float8 here)."""

    def __init__(self, code):
        self.code = code

    def __dlpack__(self, **kwargs):
        from tensorcore.dlpack import _dtype_field

        capsule = np.zeros(2, np.uint8).__dlpack__(**kwargs)
        _dtype_field(capsule).code = self.code
        return capsule

    def __dlpack_device__(self):
        return (1, 0)


def test_dlpack_dtypes_tensorcore_lacks_raise_a_type_error():
    with pytest.raises(TypeError, match="^from_dlpack: dtype int16 is not supported; convert"):
        tc.from_dlpack(np.zeros(2, np.int16))
    with pytest.raises(TypeError, match="^from_dlpack: cannot import a DLPack tensor of dtype 8-bit DLPack type code 10"):
        tc.from_dlpack(_Producer(10))


# ----- seeded randomness -----------------------------------------------------------------------
@pytest.mark.parametrize("draw", [
    lambda g: tc.rand(3, 4, generator=g), lambda g: tc.randn(5, generator=g, dtype=tc.float64),
    lambda g: tc.randint(0, 10, (6,), generator=g), lambda g: tc.ones(4).uniform_(-1, 1, generator=g),
    lambda g: tc.zeros(4).normal_(2.0, 0.5, generator=g),
])
def test_generator_reproducibility(backend, draw):
    device = tc.get_backend().device
    first = draw(tc.Generator(device, seed=11)).numpy()
    second = draw(tc.Generator(device, seed=11)).numpy()
    other = draw(tc.Generator(device, seed=12)).numpy()
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, other)
    generator = tc.Generator(device, seed=11)
    assert not np.array_equal(draw(generator).numpy(), draw(generator).numpy())  # the stream advances


def test_manual_seed_reproduces_the_default_stream(backend):
    tc.manual_seed(1234)
    first = [tc.rand(3).numpy(), tc.randn(2, 2).numpy(), tc.randint(5, size=(4,)).numpy()]
    tc.manual_seed(1234)
    second = [tc.rand(3).numpy(), tc.randn(2, 2).numpy(), tc.randint(5, size=(4,)).numpy()]
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="manual_seed"):
        tc.manual_seed(-1)


def test_random_distributions(backend):
    g = tc.Generator(tc.get_backend().device, seed=0)
    uniform = tc.rand(20_000, generator=g).numpy()
    normal = tc.randn(20_000, generator=g).numpy()
    integers = tc.randint(-3, 4, (20_000,), generator=g).numpy()
    assert uniform.dtype == np.float32 and 0 <= uniform.min() and uniform.max() < 1
    assert abs(uniform.mean() - 0.5) < 0.01 and abs(normal.mean()) < 0.03 and abs(normal.std() - 1) < 0.03
    assert integers.dtype == np.int64 and set(np.unique(integers)) == set(range(-3, 4))
    like = tc.randn_like(tc.zeros(2, 3, dtype=tc.float64), generator=g)
    assert like.shape == (2, 3) and like.dtype == tc.float64
    assert tc.rand_like(tc.zeros(4)).shape == (4,)
    with pytest.raises(ValueError, match="randint"):
        tc.randint(3, 3, (2,))
