"""Every layer on the GPU: forward and backward on device 'cuda' (the CuPy backend) match the
same model, with the same weights, run by the NumPy backend on the CPU."""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import pytest

import layers
import tensorcore as tc

pytestmark = pytest.mark.gpu

RTOL, ATOL = 2e-4, 2e-5


def _leaves(obj: Any) -> list[Any]:
    if isinstance(obj, tuple | list):
        return [leaf for item in obj for leaf in _leaves(item)]
    return [] if obj is None else [obj]


def _run(model: layers.Module, arrays: list[np.ndarray], device: str, call: Callable[..., Any], seed: int
         ) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, np.ndarray]]:
    inputs = [tc.tensor(a, device=device, requires_grad=a.dtype.kind == "f") for a in arrays]
    outputs = _leaves(call(model, *inputs))
    rng = np.random.default_rng(seed)
    loss = None
    for out in outputs:
        term = (out * tc.tensor(rng.standard_normal(out.shape).astype(out.dtype), device=device)).sum()
        loss = term if loss is None else loss + term
    loss.backward()
    input_grads = [t.grad.numpy() for t in inputs if t.requires_grad]
    param_grads = {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}
    return [o.numpy() for o in outputs], input_grads, param_grads


def check(model: layers.Module, arrays: list[np.ndarray], call: Callable[..., Any] | None = None, seed: int = 0) -> None:
    call = call or (lambda m, *xs: m(*xs))
    gpu_model = copy.deepcopy(model).to("cuda")
    with tc.use_backend("numpy"):
        expected = _run(model, arrays, "cpu", call, seed)
    actual = _run(gpu_model, arrays, "cuda", call, seed)
    for kind, want, got in zip(("output", "input grad"), expected[:2], actual[:2]):
        assert len(want) == len(got)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL * max(1.0, np.abs(w).max()), err_msg=kind)
    assert expected[2].keys() == actual[2].keys()
    for name, w in expected[2].items():
        np.testing.assert_allclose(actual[2][name], w, rtol=RTOL, atol=ATOL * max(1.0, np.abs(w).max()), err_msg=name)


def randn(*shape: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


IMAGE_LAYERS = {
    "conv2d": lambda: layers.Conv2d(4, 6, 3, stride=2, padding=1),
    "conv2d_groups": lambda: layers.Conv2d(4, 6, 3, padding="same", groups=2),
    "conv_transpose2d": lambda: layers.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1),
    "upsample_nearest": lambda: layers.Upsample(scale_factor=2),
    "upsample_bilinear": lambda: layers.Upsample(size=(11, 7), mode="bilinear", align_corners=False),
    "max_pool2d": lambda: layers.MaxPool2d(3, stride=2, padding=1),
    "avg_pool2d": lambda: layers.AvgPool2d(2),
    "batch_norm2d": lambda: layers.BatchNorm2d(4),
    "batch_norm2d_eval": lambda: layers.BatchNorm2d(4).eval(),
    "group_norm": lambda: layers.GroupNorm(2, 4),
    "layer_norm": lambda: layers.LayerNorm((8, 8)),
    "dropout_eval": lambda: layers.Dropout(0.5).eval(),
    "identity": lambda: layers.Identity(),
    "flatten": lambda: layers.Flatten(),
    "relu": lambda: layers.ReLU(),
    "leaky_relu": lambda: layers.LeakyReLU(0.2),
    "gelu": lambda: layers.GELU(),
    "gelu_tanh": lambda: layers.GELU("tanh"),
    "silu": lambda: layers.SiLU(),
    "tanh": lambda: layers.Tanh(),
    "sigmoid": lambda: layers.Sigmoid(),
    "softmax": lambda: layers.Softmax(1),
}


@pytest.mark.parametrize("name", sorted(IMAGE_LAYERS))
def test_image_layers(name: str) -> None:
    tc.manual_seed(0)
    check(IMAGE_LAYERS[name](), [randn(2, 4, 8, 8)])


def test_linear_and_lora() -> None:
    tc.manual_seed(0)
    check(layers.Linear(16, 8), [randn(3, 5, 16)])
    lora = layers.LoRALinear(layers.Linear(16, 8), rank=4, alpha=2.0)
    with tc.no_grad():
        lora.lora_B.normal_()
    check(lora, [randn(3, 16)])


def test_embedding() -> None:
    tc.manual_seed(0)
    check(layers.Embedding(20, 8, padding_idx=0), [np.array([[0, 3, 3, 19], [5, 0, 1, 2]])])


def test_multi_head_attention_self_with_masks() -> None:
    tc.manual_seed(0)
    padding = np.zeros((2, 6), dtype=bool)
    padding[1, 4:] = True

    def call(m: Any, x: Any, pad: Any) -> Any:
        return m(x, x, x, key_padding_mask=pad, is_causal=True)
    check(layers.MultiHeadAttention(16, 4, batch_first=True), [randn(2, 6, 16), padding], call=call)


def test_multi_head_attention_cross_without_weights() -> None:
    tc.manual_seed(0)
    check(layers.MultiHeadAttention(16, 2, kdim=8, vdim=12), [randn(5, 2, 16), randn(7, 2, 8, seed=2), randn(7, 2, 12, seed=3)],
          call=lambda m, q, k, v: m(q, k, v, need_weights=False))


def test_lstm_and_gru() -> None:
    tc.manual_seed(0)
    check(layers.LSTM(6, 8, num_layers=2, batch_first=True), [randn(3, 5, 6)])
    check(layers.GRU(6, 8, num_layers=2), [randn(5, 3, 6), randn(2, 3, 8, seed=2)])


def test_conv_lstm2d() -> None:
    tc.manual_seed(0)
    check(layers.ConvLSTM2d(2, 4, 3), [randn(2, 3, 2, 6, 6)])


@pytest.mark.parametrize("mode", ["spectral", "direct"])
def test_diffusion_conv(mode: str) -> None:
    tc.manual_seed(0)
    n = 5
    laplacian = 2 * np.eye(n * n) - np.eye(n * n, k=1) - np.eye(n * n, k=-1)
    laplacian[0, 0] = laplacian[-1, -1] = 1
    mass = np.random.default_rng(0).uniform(0.5, 1.5, n * n)
    model = layers.DiffusionConv(3, 4, laplacian, mass=mass, k=10, mode=mode, activation="relu")
    check(model, [randn(2, n * n, 3)])
    eigenvalues, eigenvectors = copy.deepcopy(model).to("cuda").eigenpairs()
    assert eigenvalues.device == "cuda" and eigenvectors.device == "cuda"
