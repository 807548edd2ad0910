"""Every layer type compiled equals the layer run eagerly, to the bit.

Each case builds a layer and its inputs; one copy runs compiled, an identical copy
eagerly, over three calls with new inputs (a trace, then replays), from the same seed,
so random layers draw the same numbers.  Outputs and the final state (running
statistics included) must match exactly.  The training variant compiles a whole step
(forward, backward, SGD with momentum) and compares the parameters after three steps.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import pytest

import layers
import tensorcore as tc
from optim import SGD


def _ring_laplacian(n: int) -> np.ndarray:
    lap = 2 * np.eye(n)
    for i in range(n):
        lap[i, (i + 1) % n] = lap[(i + 1) % n, i] = -1
    return lap


def _randn(rng: np.random.Generator, *shape: int) -> tc.Tensor:
    return tc.tensor(rng.standard_normal(shape).astype(np.float32))


def _image(*shape):
    return lambda rng: (_randn(rng, *shape),)


# name -> (layer factory, input factory, mode)
CASES: dict[str, tuple[Callable[[], Any], Callable[[np.random.Generator], tuple], str]] = {
    "Linear": (lambda: layers.Linear(5, 7), _image(3, 5), "eval"),
    "Conv2d": (lambda: layers.Conv2d(3, 4, 3, stride=2, padding=1), _image(2, 3, 8, 8), "eval"),
    "Conv2d_groups": (lambda: layers.Conv2d(4, 4, 3, padding=1, groups=2, bias=False), _image(1, 4, 5, 5), "eval"),
    "ConvTranspose2d": (lambda: layers.ConvTranspose2d(3, 2, 4, stride=2, padding=1), _image(2, 3, 4, 4), "eval"),
    "Upsample_nearest": (lambda: layers.Upsample(scale_factor=2), _image(1, 2, 3, 4), "eval"),
    "Upsample_bilinear": (lambda: layers.Upsample(size=(5, 7), mode="bilinear", align_corners=False),
                          _image(1, 2, 3, 4), "eval"),
    "MaxPool2d": (lambda: layers.MaxPool2d(2), _image(2, 3, 6, 6), "eval"),
    "AvgPool2d": (lambda: layers.AvgPool2d(3, stride=2, padding=1), _image(2, 3, 7, 7), "eval"),
    "BatchNorm2d_train": (lambda: layers.BatchNorm2d(3), _image(4, 3, 5, 5), "train"),
    "BatchNorm2d_eval": (lambda: layers.BatchNorm2d(3), _image(4, 3, 5, 5), "eval"),
    "LayerNorm": (lambda: layers.LayerNorm(6), _image(2, 3, 6), "eval"),
    "GroupNorm": (lambda: layers.GroupNorm(2, 4), _image(2, 4, 3, 3), "eval"),
    "Dropout_train": (lambda: layers.Dropout(0.3), _image(4, 10), "train"),
    "Dropout_eval": (lambda: layers.Dropout(0.3), _image(4, 10), "eval"),
    "Identity": (lambda: layers.Identity(), _image(2, 3), "eval"),
    "Flatten": (lambda: layers.Flatten(), _image(2, 3, 4), "eval"),
    "ReLU": (lambda: layers.ReLU(), _image(3, 4), "eval"),
    "LeakyReLU": (lambda: layers.LeakyReLU(0.2), _image(3, 4), "eval"),
    "GELU": (lambda: layers.GELU(), _image(3, 4), "eval"),
    "GELU_tanh": (lambda: layers.GELU("tanh"), _image(3, 4), "eval"),
    "SiLU": (lambda: layers.SiLU(), _image(3, 4), "eval"),
    "Tanh": (lambda: layers.Tanh(), _image(3, 4), "eval"),
    "Sigmoid": (lambda: layers.Sigmoid(), _image(3, 4), "eval"),
    "Softmax": (lambda: layers.Softmax(dim=1), _image(3, 4, 2), "eval"),
    "Embedding": (lambda: layers.Embedding(10, 4, padding_idx=0),
                  lambda rng: (tc.tensor(rng.integers(0, 10, (3, 5))),), "eval"),
    "MultiHeadAttention_self": (lambda: layers.MultiHeadAttention(8, 2, batch_first=True),
                                _image(2, 5, 8), "eval"),
    "MultiHeadAttention_cross_causal": (
        lambda: _Call(layers.MultiHeadAttention(8, 2, dropout=0.2, kdim=6, vdim=6, batch_first=True),
                      is_causal=True),
        lambda rng: (_randn(rng, 2, 4, 8), _randn(rng, 2, 4, 6), _randn(rng, 2, 4, 6)), "train"),
    "LSTM": (lambda: layers.LSTM(4, 6, num_layers=2), _image(5, 2, 4), "eval"),
    "GRU": (lambda: layers.GRU(4, 6, batch_first=True, num_layers=2, dropout=0.25), _image(2, 5, 4), "train"),
    "ConvLSTM2d": (lambda: layers.ConvLSTM2d(2, 3), _image(1, 3, 2, 4, 4), "eval"),
    "DiffusionConv_spectral": (lambda: layers.DiffusionConv(3, 4, _ring_laplacian(6), k=4, activation="silu"),
                               _image(2, 6, 3), "eval"),
    "DiffusionConv_direct": (lambda: layers.DiffusionConv(3, 2, _ring_laplacian(5), mode="direct"),
                             _image(5, 3), "eval"),
    "LoRALinear": (lambda: layers.LoRALinear(layers.Linear(5, 6), rank=2, alpha=2.0), _image(3, 5), "eval"),
    "Sequential": (lambda: layers.Sequential(layers.Conv2d(2, 4, 3, padding=1), layers.GroupNorm(2, 4),
                                             layers.SiLU(), layers.AvgPool2d(2), layers.Flatten(),
                                             layers.Linear(16, 3)), _image(2, 2, 4, 4), "eval"),
}


class _Call(layers.Module):
    """A layer called with fixed keyword arguments (and only its first output)."""

    def __init__(self, layer: layers.Module, **kwargs: Any) -> None:
        super().__init__()
        self.layer, self.kwargs = layer, kwargs

    def forward(self, *args: Any) -> Any:
        return self.layer(*args, **self.kwargs)[0]


def _pair(name: str) -> tuple[layers.Module, layers.Module, Callable]:
    factory, inputs, mode = CASES[name]
    tc.manual_seed(1)
    layer = factory()
    layer.train(mode == "train")
    return layer, copy.deepcopy(layer), inputs


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, tc.Tensor):
        assert isinstance(b, tc.Tensor) and a.shape == b.shape and a.dtype == b.dtype
        assert np.array_equal(a.numpy(), b.numpy(), equal_nan=True)
    elif isinstance(a, tuple | list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def _run(fn: Callable, inputs: Callable, calls: int = 3) -> list:
    tc.manual_seed(7)
    rng = np.random.default_rng(3)
    return [fn(*inputs(rng)) for _ in range(calls)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_forward_compiled_equals_eager(backend, name):
    layer, twin, inputs = _pair(name)
    compiled = tc.compile(layer, cache_dir=False)
    _assert_same(_run(compiled, inputs), _run(twin, inputs))
    _assert_same(list(layer.state_dict().values()), list(twin.state_dict().values()))
    info = compiled.cache_info()
    assert info.eager_only == 0 and info.hits >= 1, info


@pytest.mark.parametrize("name", sorted(n for n in CASES if list(CASES[n][0]().parameters())))
def test_layer_train_step_compiled_equals_eager(backend, name):
    layer, twin, inputs = _pair(name)

    def trainer(model: layers.Module) -> Callable:
        opt = SGD([p for p in model.parameters() if p.requires_grad], lr=0.05, momentum=0.9)

        def step(*xs: tc.Tensor) -> tc.Tensor:
            opt.zero_grad()
            out = model(*xs)
            out = out[0] if isinstance(out, tuple) else out
            loss = (out * out).mean()
            loss.backward()
            opt.step()
            return loss
        return step

    compiled = tc.compile(trainer(layer), cache_dir=False)
    _assert_same(_run(compiled, inputs, 5), _run(trainer(twin), inputs, 5))
    _assert_same(list(layer.state_dict().values()), list(twin.state_dict().values()))
    assert compiled.cache_info().hits >= 1
