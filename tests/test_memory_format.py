"""Memory formats: ``Module.to(memory_format=tc.channels_last)`` stores 4-D parameters and
buffers as N, H, W, C in memory with their shapes, values and identities unchanged, so
every op gives the results it gave on contiguous weights; ``tc.contiguous_format`` puts
them back.  The GPU's convolution reading such weights with no packed copy is checked in
``test_cuda_channels_last.py``."""

from __future__ import annotations

import numpy as np
import pytest

import layers
import tensorcore as tc
import tensorcore.functional as F
from tensorcore import memory_format as formats


class _Net(layers.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = layers.Conv2d(3, 8, 3, padding=1)
        self.norm = layers.GroupNorm(2, 8)
        self.point = layers.Conv2d(8, 4, 1)

    def forward(self, x: tc.Tensor) -> tc.Tensor:
        return self.point(F.silu(self.norm(self.conv(x))))


def _channels_last_strides(a) -> bool:
    n, c, h, w = a.shape
    item = a.dtype.itemsize
    return a.strides == (h * w * c * item, item, w * c * item, c * item)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_channels_last_weights_give_the_same_results_and_gradients(backend) -> None:
    with tc.use_backend(backend):
        tc.manual_seed(0)
        plain, laid = _Net(), _Net()
        laid.load_state_dict(plain.state_dict())
        weight = laid.conv.weight
        assert laid.to(memory_format=tc.channels_last) is laid
        assert laid.conv.weight is weight and _channels_last_strides(weight.data)
        np.testing.assert_array_equal(weight.numpy(), plain.conv.weight.numpy())
        x = tc.tensor(np.random.default_rng(0).standard_normal((2, 3, 6, 5)))
        want, got = plain(x), laid(x)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        got.sum().backward()
        want.sum().backward()
        np.testing.assert_allclose(laid.conv.weight.grad.numpy(), plain.conv.weight.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_only_four_dimensional_tensors_change_and_contiguous_format_restores_them() -> None:
    net = _Net().to(memory_format=tc.channels_last)
    assert net.norm.weight.data.flags.c_contiguous and net.conv.bias.data.flags.c_contiguous
    assert formats.is_laid_out(net.conv.weight.data, tc.channels_last)
    assert formats.is_laid_out(net.point.weight.data, tc.contiguous_format)  # 1x1: both at once
    before = net.conv.weight.numpy().copy()
    net.to(memory_format=tc.contiguous_format)
    assert net.conv.weight.data.flags.c_contiguous
    np.testing.assert_array_equal(net.conv.weight.numpy(), before)


def test_a_state_dict_loads_into_channels_last_weights() -> None:
    source, target = _Net(), _Net().to(memory_format=tc.channels_last)
    target.load_state_dict(source.state_dict())
    assert _channels_last_strides(target.conv.weight.data)
    np.testing.assert_array_equal(target.conv.weight.numpy(), source.conv.weight.numpy())


def test_an_unknown_memory_format_is_a_type_error_before_anything_moves() -> None:
    net = _Net()
    data = net.conv.weight.data
    with pytest.raises(TypeError, match="Module.to: memory_format must be"):
        net.to(tc.float16, memory_format="channels_last")
    assert net.conv.weight.data is data and net.conv.weight.dtype == tc.float32
    assert repr(tc.channels_last) == "tensorcore.channels_last"


def test_a_cast_and_a_layout_in_one_call() -> None:
    source = _Net()
    net = _Net()
    net.load_state_dict(source.state_dict())
    weight = net.conv.weight
    net.to(tc.float16, memory_format=tc.channels_last)
    assert net.conv.weight is weight and weight.dtype == tc.float16 and _channels_last_strides(weight.data)
    np.testing.assert_array_equal(weight.numpy(), source.conv.weight.numpy().astype(np.float16))
