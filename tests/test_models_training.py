"""Training through both models: gradients reach every parameter (and match torch's on the
same weights), and one optimizer step changes all of them."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcore as tc
import tensorcore.functional as F
from diffusion import AutoencoderKL, UNet2D
from models_oracle import SMALL_UNET, SMALL_VAE, diffusers_twin, randn
from optim import AdamW


def train_step_changes_every_parameter(model, loss_fn) -> None:
    model.train()
    before = {name: p.numpy().copy() for name, p in model.named_parameters()}
    optimizer = AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    loss = loss_fn(model)
    loss.backward()
    # (a key bias shifts every score of a query equally, so softmax makes its gradient vanish up to rounding)
    no_grad = [name for name, p in model.named_parameters()
               if p.grad is None or not (np.abs(p.grad.numpy()).max() > 0 or name.endswith("to_k.bias"))]
    assert not no_grad, f"no gradient reached {no_grad}"
    optimizer.step()
    unchanged = [name for name, p in model.named_parameters() if np.array_equal(p.numpy(), before[name])]
    assert not unchanged, f"the step left {unchanged} unchanged"


def test_unet_training_step_reaches_every_parameter() -> None:
    unet = UNet2D(**{**SMALL_UNET, "cross_attention_dim": 6, "dropout": 0.1})
    x, noise = tc.tensor(randn(2, 3, 8, 8)), tc.tensor(randn(2, 3, 8, 8, seed=1))
    context = tc.tensor(randn(2, 5, 6, seed=2))
    train_step_changes_every_parameter(
        unet, lambda m: F.mse_loss(m(x + noise, tc.tensor([10, 700]), tc.tensor([1, 3]), context=context), noise))


def test_vae_training_step_reaches_every_parameter() -> None:
    vae = AutoencoderKL(**SMALL_VAE)
    x = tc.tensor(randn(2, 3, 16, 16))

    def loss(m):
        posterior = m.encode(x)
        reconstruction = m.decode(posterior.sample(tc.Generator(seed=0)))
        return F.mse_loss(reconstruction, x) + posterior.kl().mean() * 1e-3

    train_step_changes_every_parameter(vae, loss)


@pytest.mark.parametrize("kind", ["unet", "vae"])
def test_parameter_gradients_match_torch(kind, tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    theirs, ours = diffusers_twin(kind, SMALL_UNET if kind == "unet" else SMALL_VAE, tmp_path, double=True)
    x = randn(2, 3, 8, 8, dtype=np.float64)
    cotangent = randn(2, 3, 8, 8, seed=5, dtype=np.float64)
    if kind == "unet":
        out = theirs(torch.tensor(x), torch.tensor([0, 0]), class_labels=torch.tensor([1, 2])).sample
        mine = ours(tc.tensor(x), tc.tensor([0, 0]), tc.tensor([1, 2]))
    else:
        out = theirs(torch.tensor(x)).sample
        mine = ours(tc.tensor(x))
    (out * torch.tensor(cotangent)).sum().backward()
    (mine * tc.tensor(cotangent)).sum().backward()
    grads = dict(ours.named_parameters())
    scale = max(np.abs(p.grad.numpy()).max() for p in theirs.parameters())
    for name, p in theirs.named_parameters():
        np.testing.assert_allclose(grads[name].grad.numpy(), p.grad.numpy(), rtol=1e-7, atol=1e-12 * scale, err_msg=name)
