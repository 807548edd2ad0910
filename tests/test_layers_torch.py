"""Layers against torch.nn in float64: the same weights (loaded through ``load_state_dict``
from torch's own state dict, so the parameter names match too) must give the same outputs,
input gradients and parameter gradients."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import layers
import tensorcore as tc

torch = pytest.importorskip("torch")
nn = torch.nn

RTOL, ATOL = 1e-8, 1e-10


def _leaves(obj: Any) -> list[Any]:
    """The tensors of a nested tuple output, in order (None skipped)."""
    if isinstance(obj, tuple | list):
        return [leaf for item in obj for leaf in _leaves(item)]
    return [] if obj is None else [obj]


def compare(ours: layers.Module, theirs: Any, inputs: list[np.ndarray], kwargs: Callable[[Any], dict] | None = None,
            call: Callable[..., Any] | None = None, seed: int = 0) -> None:
    """Load torch's weights into ours, run both, backprop one random cotangent, compare everything.

    ``kwargs(lib)`` gives keyword arguments for lib = tc or torch; ``call(module, *inputs, **kw)``
    replaces the plain ``module(*inputs, **kw)``.
    """
    theirs = theirs.double()
    ours = ours.double()
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    ours_in = [tc.tensor(a, requires_grad=a.dtype.kind == "f") for a in inputs]
    torch_in = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in inputs]
    make_kwargs = kwargs or (lambda lib: {})
    call = call or (lambda module, *args, **kw: module(*args, **kw))
    ours_out = _leaves(call(ours, *ours_in, **make_kwargs(tc)))
    torch_out = _leaves(call(theirs, *torch_in, **make_kwargs(torch)))
    assert len(ours_out) == len(torch_out)
    rng = np.random.default_rng(seed)
    ours_loss, torch_loss = 0.0, 0.0
    for a, b in zip(ours_out, torch_out):
        assert a.shape == tuple(b.shape)
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=RTOL, atol=ATOL)
        g = rng.standard_normal(a.shape)
        ours_loss = ours_loss + (a * tc.tensor(g)).sum()
        torch_loss = torch_loss + (b * torch.tensor(g)).sum()
    ours_loss.backward()
    torch_loss.backward()
    for a, b in zip(ours_in, torch_in):
        if b.requires_grad:
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=RTOL, atol=ATOL)
    torch_params = dict(theirs.named_parameters())
    ours_params = dict(ours.named_parameters())
    assert set(ours_params) == set(torch_params)
    for name, p in ours_params.items():
        np.testing.assert_allclose(p.grad.numpy(), torch_params[name].grad.numpy(), rtol=RTOL, atol=ATOL, err_msg=name)


def randn(*shape: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def test_linear() -> None:
    compare(layers.Linear(5, 3), nn.Linear(5, 3), [randn(2, 4, 5)])
    compare(layers.Linear(5, 3, bias=False), nn.Linear(5, 3, bias=False), [randn(4, 5)])


@pytest.mark.parametrize("kwargs", [dict(), dict(stride=2, padding=1), dict(padding=2, dilation=2, groups=2),
                                    dict(padding="same", bias=False)])
def test_conv2d(kwargs: dict) -> None:
    compare(layers.Conv2d(4, 6, 3, **kwargs), nn.Conv2d(4, 6, 3, **kwargs), [randn(2, 4, 9, 8)])


@pytest.mark.parametrize("kwargs", [dict(), dict(stride=2, padding=1, output_padding=1), dict(stride=2, groups=2),
                                    dict(padding=1, dilation=2, bias=False)])
def test_conv_transpose2d(kwargs: dict) -> None:
    compare(layers.ConvTranspose2d(4, 6, 3, **kwargs), nn.ConvTranspose2d(4, 6, 3, **kwargs), [randn(2, 4, 5, 6)])


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm2d(training: bool) -> None:
    ours, theirs = layers.BatchNorm2d(3, momentum=0.2), nn.BatchNorm2d(3, momentum=0.2)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.uniform_(-0.5, 0.5)
        theirs.running_mean.uniform_(-1, 1)
        theirs.running_var.uniform_(0.5, 2)
    ours.train(training)
    theirs.train(training)
    compare(ours, theirs, [randn(4, 3, 5, 5)])
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        np.testing.assert_allclose(getattr(ours, name).numpy(), getattr(theirs, name).numpy(), rtol=RTOL, err_msg=name)


def test_layer_norm() -> None:
    theirs = nn.LayerNorm((4, 5))
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.uniform_(-0.5, 0.5)
    compare(layers.LayerNorm((4, 5)), theirs, [randn(3, 4, 5)])


def test_group_norm() -> None:
    theirs = nn.GroupNorm(2, 6)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.uniform_(-0.5, 0.5)
    compare(layers.GroupNorm(2, 6), theirs, [randn(2, 6, 4, 3)])


def test_embedding() -> None:
    indices = np.array([[0, 3, 3], [9, 1, 0]])
    compare(layers.Embedding(10, 4), nn.Embedding(10, 4), [indices])
    compare(layers.Embedding(10, 4, padding_idx=3), nn.Embedding(10, 4, padding_idx=3), [indices])


def _attention_pair(**kwargs: Any) -> tuple[layers.MultiHeadAttention, Any]:
    ours = layers.MultiHeadAttention(8, 2, **kwargs)
    theirs = nn.MultiheadAttention(8, 2, **kwargs)
    with torch.no_grad():  # torch starts its biases at zero; make them matter
        for p in theirs.parameters():
            if p.ndim == 1:
                p.uniform_(-0.5, 0.5)
    return ours, theirs


def test_self_attention_batch_first_with_key_padding() -> None:
    padding = np.zeros((2, 5), dtype=bool)
    padding[0, 3:] = True
    compare(*_attention_pair(batch_first=True), [randn(2, 5, 8)], call=lambda m, x, **kw: m(x, x, x, **kw),
            kwargs=lambda lib: dict(key_padding_mask=lib.tensor(padding)))


def test_self_attention_causal_sequence_first() -> None:
    causal = np.triu(np.ones((5, 5), dtype=bool), 1)
    def kwargs(lib: Any) -> dict:  # torch needs the mask; ours builds it from is_causal
        return dict(attn_mask=torch.tensor(causal), average_attn_weights=False) if lib is torch else \
            dict(is_causal=True, average_attn_weights=False)
    compare(*_attention_pair(), [randn(5, 3, 8)], call=lambda m, x, **kw: m(x, x, x, **kw), kwargs=kwargs)


def test_cross_attention_kdim_vdim_float_mask_no_weights() -> None:
    mask = randn(3 * 2, 4, 6, seed=7)
    compare(*_attention_pair(kdim=5, vdim=7, batch_first=True), [randn(3, 4, 8), randn(3, 6, 5, seed=2), randn(3, 6, 7, seed=3)],
            kwargs=lambda lib: dict(attn_mask=lib.tensor(mask), need_weights=False))


def test_cross_attention_packed_weights_unbatched() -> None:
    compare(*_attention_pair(), [randn(4, 8), randn(6, 8, seed=2), randn(6, 8, seed=3)])


def test_lstm_two_layers_batch_first_with_state() -> None:
    h0, c0 = randn(2, 3, 6, seed=4), randn(2, 3, 6, seed=5)
    compare(layers.LSTM(4, 6, num_layers=2, batch_first=True), nn.LSTM(4, 6, num_layers=2, batch_first=True),
            [randn(3, 5, 4), h0, c0], call=lambda m, x, h, c: m(x, (h, c)))


def test_lstm_unbatched_no_bias() -> None:
    compare(layers.LSTM(4, 5, bias=False), nn.LSTM(4, 5, bias=False), [randn(7, 4)])


def test_gru_two_layers_with_state() -> None:
    compare(layers.GRU(4, 6, num_layers=2), nn.GRU(4, 6, num_layers=2), [randn(5, 3, 4), randn(2, 3, 6, seed=3)])


def test_gru_batch_first() -> None:
    compare(layers.GRU(3, 4, batch_first=True), nn.GRU(3, 4, batch_first=True), [randn(2, 6, 3)])
