"""PyTorch habits work: dim=/keepdim= on reductions and the softmax family (max/min with
dim= return (values, indices)), "cuda:N" and tc.device, Tensor.T and Tensor.mT."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import tensorcore as tc
import tensorcore.functional as F
from op_harness import load_torch

torch = load_torch()
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (pip install torch==2.13.0)")

REDUCTIONS = ["sum", "mean", "var", "std", "prod", "logsumexp", "max", "min", "argmax", "argmin"]


def _values(x: np.ndarray) -> tc.Tensor:
    return tc.tensor(x, dtype=tc.float64)


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("keep", [False, True])
def test_dim_and_keepdim_mean_axis_and_keepdims(backend, name, keep):
    x = _values(np.random.default_rng(0).standard_normal((3, 4, 2)))
    numpy_style = getattr(x, name)(axis=1, keepdims=keep)
    for torch_style in (getattr(x, name)(dim=1, keepdim=keep), getattr(tc, name)(x, dim=1, keepdim=keep)):
        if name in ("max", "min"):
            torch_style = torch_style.values
        assert torch_style.shape == numpy_style.shape
        np.testing.assert_array_equal(torch_style.numpy(), numpy_style.numpy())


@pytest.mark.parametrize("name", REDUCTIONS + ["softmax", "log_softmax"])
def test_both_spellings_at_once_raise(name):
    x = tc.ones(2, 3)
    with pytest.raises(TypeError, match=f"^{name}: got both axis=0 and dim=1"):
        getattr(x, name)(axis=0, dim=1)
    if name not in ("softmax", "log_softmax"):
        with pytest.raises(TypeError, match=f"^{name}: got both keepdims= and keepdim="):
            getattr(x, name)(0, keepdims=True, keepdim=True)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_family_takes_dim(backend, name):
    x = _values(np.random.default_rng(1).standard_normal((3, 4)))
    expected = getattr(F, name)(x, 0).numpy()
    for out in (getattr(F, name)(x, dim=0), getattr(x, name)(dim=0), getattr(tc, name)(x, dim=0)):
        np.testing.assert_array_equal(out.numpy(), expected)
    np.testing.assert_array_equal(getattr(F, name)(x).numpy(), getattr(F, name)(x, -1).numpy())


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("keep", [False, True])
def test_max_and_min_with_dim_return_values_and_indices(backend, name, keep):
    data = np.array([[1.0, 5.0, 5.0, -2.0], [7.0, 0.0, 7.0, 7.0], [-1.0, -3.0, -1.0, 2.0]])
    x = tc.tensor(data, dtype=tc.float64, requires_grad=True)
    result = getattr(x, name)(dim=1, keepdim=keep)
    values, indices = result  # a named pair, as torch.return_types
    assert result.values is values and result.indices is indices
    pick = np.argmax if name == "max" else np.argmin
    expected_indices = pick(data, axis=1)
    np.testing.assert_array_equal(indices.numpy().reshape(-1), expected_indices)
    np.testing.assert_array_equal(values.numpy().reshape(-1), data[np.arange(3), expected_indices])
    assert indices.dtype == tc.int64 and values.shape == indices.shape == ((3, 1) if keep else (3,))
    (values * tc.tensor([1.0, 2.0, 3.0], dtype=tc.float64).reshape(values.shape)).sum().backward()
    grad = np.zeros_like(data)
    grad[np.arange(3), expected_indices] = [1.0, 2.0, 3.0]  # all of it to the returned index, ties too
    np.testing.assert_array_equal(x.grad.numpy(), grad)


@needs_torch
@pytest.mark.parametrize("name", ["max", "min"])
def test_max_and_min_with_dim_match_torch(name):
    data = np.random.default_rng(2).integers(-2, 3, size=(4, 5, 3)).astype(np.float32)  # many ties
    for dim in (0, 1, -1):
        mine = getattr(tc.tensor(data), name)(dim=dim)
        theirs = getattr(torch.from_numpy(data), name)(dim=dim)
        np.testing.assert_array_equal(mine.values.numpy(), theirs.values.numpy())
        np.testing.assert_array_equal(mine.indices.numpy(), theirs.indices.numpy())
        x, t = tc.tensor(data, requires_grad=True), torch.from_numpy(data).requires_grad_()
        getattr(x, name)(dim=dim).values.sum().backward()
        getattr(t, name)(dim=dim).values.sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), t.grad.numpy())


def test_max_of_a_0d_tensor_with_dim_and_of_an_empty_axis():
    values, indices = tc.tensor(3.0).max(dim=0)
    assert values.item() == 3.0 and indices.item() == 0 and indices.dtype == tc.int64
    with pytest.raises(ValueError, match="max: cannot reduce axis 1 of size 0"):
        tc.ones(2, 0).max(dim=1)


# ----- transposes -----------------------------------------------------------------------------
def test_T_and_mT_as_torch(backend):
    rng = np.random.default_rng(3)
    matrix, batch = rng.standard_normal((2, 3)), rng.standard_normal((4, 2, 3))
    np.testing.assert_array_equal(_values(matrix).T.numpy(), matrix.T)
    np.testing.assert_array_equal(_values(batch).mT.numpy(), np.swapaxes(batch, -1, -2))
    np.testing.assert_array_equal(_values(matrix).mT.numpy(), matrix.T)
    x = tc.tensor(batch, dtype=tc.float64, requires_grad=True)
    (x.mT * _values(np.arange(24.0).reshape(4, 3, 2))).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.swapaxes(np.arange(24.0).reshape(4, 3, 2), -1, -2))
    with pytest.raises(ValueError, match=r"mT: needs a tensor of at least 2 dims, got shape \(3,\)"):
        tc.ones(3).mT
    if torch is not None:
        np.testing.assert_array_equal(_values(batch).mT.numpy(), torch.from_numpy(batch).mT.numpy())


# ----- devices --------------------------------------------------------------------------------
def test_device_objects():
    assert str(tc.device("cuda", 0)) == "cuda:0" and tc.device("cuda:0") == tc.device("cuda", 0)
    assert tc.device("cuda:1") == "cuda:1" and tc.device("cpu") == "cpu" and tc.device("cuda") != "cuda:0"
    assert repr(tc.device("cuda", 2)) == "device(type='cuda', index=2)"
    assert tc.device(tc.device("cpu")).type == "cpu" and tc.device("cpu").index is None
    assert len({tc.device("cuda:0"), tc.device("cuda", 0)}) == 1
    for bad, error in [("gpu", ValueError), ("cuda:", ValueError), ("cuda:-1", ValueError), (0, TypeError)]:
        with pytest.raises(error, match="device"):
            tc.device(bad)
    with pytest.raises(ValueError, match="index"):
        tc.device("cuda:0", 1)


@pytest.mark.parametrize("spec", ["cpu", "cpu:0", tc.device("cpu"), tc.device("cpu", 0)])
def test_cpu_device_spellings_are_accepted_everywhere(spec):
    import layers

    assert tc.zeros(2, device=spec).device == "cpu"
    assert tc.randn(2, device=spec).device == "cpu"
    assert tc.tensor([1.0], device=spec).device == "cpu"
    assert tc.ones(2).to(spec).device == "cpu"
    assert tc.Generator(spec, seed=0).device == "cpu"
    assert layers.Linear(2, 2).to(spec).weight.device == "cpu"


@pytest.mark.parametrize("spec, text", [("cpu:1", "one CPU device"), ("tpu", "valid devices"),
                                        (tc.device("cpu", 3), "one CPU device")])
def test_bad_devices_raise_before_any_work(spec, text):
    x = tc.ones(2)
    for make in (lambda: tc.zeros(2, device=spec), lambda: x.to(spec), lambda: tc.rand(2, device=spec)):
        with pytest.raises(ValueError, match=text):
            make()


@pytest.fixture
def two_gpus(monkeypatch):
    """A stand-in for CuPy's runtime with two visible devices, device 0 current."""
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 2, getDevice=lambda: 0,
                                    CUDARuntimeError=RuntimeError)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime)))


def test_cuda_indices_are_checked_against_the_visible_devices(two_gpus):
    from tensorcore.devices import canonical

    assert canonical("cuda:0") == "cuda" and canonical(tc.device("cuda", 0)) == "cuda"
    with pytest.raises(ValueError, match=r"'cuda:2': the visible CUDA devices are cuda:0..cuda:1"):
        canonical("cuda:2")
    with pytest.raises(ValueError, match=r"'cuda:1': .*current CUDA device, cuda:0.*cupy.cuda.Device\(1\).use\(\)"):
        canonical("cuda:1")


@pytest.mark.gpu
def test_cuda_index_spellings_on_the_gpu():
    cupy = pytest.importorskip("cupy")
    current, count = cupy.cuda.runtime.getDevice(), cupy.cuda.runtime.getDeviceCount()
    x = tc.ones(3, device=f"cuda:{current}")
    assert x.device == "cuda" and x.to(tc.device("cuda", current)).device == "cuda"
    assert x.to("cpu:0").device == "cpu"
    with pytest.raises(ValueError, match=f"cuda:{count}"):
        tc.ones(3, device=f"cuda:{count}")
