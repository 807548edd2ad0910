"""Flash attention (``backends/cupy/flash_attention.py``) against attention in float64.

Inputs come as the UNet's attention makes them: views of a projection's [B, L, H·d]
output (strided heads), or contiguous [B, H, L, d].  Bounds are on max |error| of outputs
whose values are averages of v ~ N(0, 1): float16 rounds P to 11 bits before P·V, bfloat16
to 8.  The backward (``flash_attention_bwd.py``) is checked against float64 gradients of the
same rounded inputs, bounded relative to the largest gradient (P and dS are rounded to
16 bits before their MMAs).  The op path is checked too: ``scaled_dot_product_attention``
takes the forward kernel without gradients and the forward + backward pair with them;
and CUDA graph replays equal the eager calls.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

import tensorcore as tc  # noqa: E402
import tensorcore.functional as F  # noqa: E402
from tensorcore.backends.cupy import flash_attention, flash_attention_bwd  # noqa: E402

BOUNDS = {"float16": 4e-3, "bfloat16": 3e-2}
# lse = m + log2(l) with l summed from P as the MMA takes it, each P rounded to 16 bits:
# log2(1 + its relative error) (float16: ex2.approx.f16x2's 2^-9.9 and its argument's
# rounding; bfloat16: the 2^-8 rounding of P)
LSE_BOUNDS = {"float16": 3e-3, "bfloat16": 6e-3}
GRAD_BOUNDS = {"float16": 1e-2, "bfloat16": 6e-2}  # relative to the largest gradient
DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, scale: float,
              mask: np.ndarray | None = None) -> np.ndarray:
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scores = q @ k.swapaxes(-1, -2) * scale
    if mask is not None:
        scores = scores + mask.astype(np.float64)
    if causal:
        lq, lk = scores.shape[-2:]
        scores = np.where(np.arange(lk)[None, :] > np.arange(lq)[:, None], -np.inf, scores)
    return probabilities(scores) @ v


def probabilities(scores: np.ndarray) -> np.ndarray:
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def reference_grads(q, k, v, g, causal: bool, scale: float):
    """(dq, dk, dv, lse) in float64: lse the rows' log2 Σ_j exp(s_ij)."""
    q, k, v, g = (x.astype(np.float64) for x in (q, k, v, g))
    scores = q @ k.swapaxes(-1, -2) * scale
    if causal:
        lq, lk = scores.shape[-2:]
        scores = np.where(np.arange(lk)[None, :] > np.arange(lq)[:, None], -np.inf, scores)
    top = scores.max(-1, keepdims=True)
    lse = (top[..., 0] + np.log(np.exp(scores - top).sum(-1))) / math.log(2)
    p = probabilities(scores)
    dp = g @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * scale
    return ds @ k, ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ g, lse


def on_host(a) -> np.ndarray:
    return tc.Tensor(a, "cuda").numpy().astype(np.float64)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))


def heads(rng: np.random.Generator, b: int, h: int, length: int, d: int, dtype: str, strided: bool):
    """(host values [B, H, L, d], the device array): strided = a view of [B, L, H·d]."""
    values = rng.standard_normal((b, length, h, d)).astype(DTYPES[dtype])
    device = tc.tensor(values, device="cuda").data.transpose(0, 2, 1, 3)
    host = values.transpose(0, 2, 1, 3)
    return (host, device) if strided else (np.ascontiguousarray(host), cp.ascontiguousarray(device))


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 3), d=st.sampled_from([40, 64, 80, 128, 160]),
       lq=st.sampled_from([1, 17, 64, 77, 130, 257]), lk=st.sampled_from([1, 8, 63, 77, 129, 300]),
       causal=st.booleans(), strided=st.booleans(), dtype=st.sampled_from(list(BOUNDS)), seed=st.integers(0, 99))
def test_flash_attention_matches_float64(b, h, d, lq, lk, causal, strided, dtype, seed) -> None:
    rng = np.random.default_rng(seed)
    (q, qd), (k, kd), (v, vd) = (heads(rng, b, h, n, d, dtype, strided) for n in (lq, lk, lk))
    assert flash_attention.fits(qd, kd, vd)
    scale = 1 / math.sqrt(d)
    out = flash_attention.forward(qd, kd, vd, causal, scale)
    assert out.transpose(0, 2, 1, 3).flags.c_contiguous  # heads merge back without a copy
    got = tc.Tensor(out, "cuda").numpy().astype(np.float64)
    want = reference(q, k, v, causal, scale)
    if causal and lk < lq:  # rows that see no key: the reference's 0/0
        want = np.nan_to_num(want)
        got[..., lk:, :] = 0.0
        want[..., lk:, :] = 0.0
    assert np.abs(got - want).max() <= BOUNDS[dtype]


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 2), d=st.sampled_from([40, 64, 80, 128, 160]),
       lq=st.sampled_from([1, 17, 64, 77, 130]), lk=st.sampled_from([1, 8, 63, 77, 129]),
       causal=st.booleans(), strided=st.booleans(), dtype=st.sampled_from(list(BOUNDS)), seed=st.integers(0, 99))
def test_flash_attention_backward_matches_float64(b, h, d, lq, lk, causal, strided, dtype, seed) -> None:
    rng = np.random.default_rng(seed)
    (q, qd), (k, kd), (v, vd), (g, gd) = (heads(rng, b, h, n, d, dtype, strided) for n in (lq, lk, lk, lq))
    scale = 1 / math.sqrt(d)
    out, lse = flash_attention.forward(qd, kd, vd, causal, scale, with_lse=True)
    *want, want_lse = reference_grads(q, k, v, g, causal, scale)
    assert np.abs(on_host(lse) - want_lse).max() <= LSE_BOUNDS[dtype]
    got = flash_attention_bwd.backward(gd, qd, kd, vd, out, lse, causal, scale)
    for name, x, w in zip(("dq", "dk", "dv"), got, want):
        assert x.shape == w.shape
        assert relative_error(on_host(x), w) <= GRAD_BOUNDS[dtype], name


def test_flash_attention_backward_replays_in_a_cuda_graph() -> None:
    rng = np.random.default_rng(1)
    (_, q), (_, k), (_, v), (_, g) = (heads(rng, 2, 4, n, 64, "float16", True) for n in (300, 200, 200, 300))
    out, lse = flash_attention.forward(q, k, v, False, 0.125, with_lse=True)
    eager = flash_attention_bwd.backward(g, q, k, v, out, lse, False, 0.125)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        flash_attention_bwd.backward(g, q, k, v, out, lse, False, 0.125)
        stream.synchronize()
        stream.begin_capture()
        captured = flash_attention_bwd.backward(g, q, k, v, out, lse, False, 0.125)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    dq, dk, dv = (on_host(x) for x in captured)
    want_dq, want_dk, want_dv = (on_host(x) for x in eager)
    np.testing.assert_array_equal(dk, want_dk)
    np.testing.assert_array_equal(dv, want_dv)
    assert relative_error(dq, want_dq) <= 1e-3  # dq sums over key blocks with atomics, in any order


def masks(rng: np.random.Generator, kind: str, b: int, h: int, lq: int, lk: int, dtype: str) -> np.ndarray:
    """An additive mask as SDPA gets it, every row seeing a key: "padding" [B, 1, 1, Lk]
    (-inf past each sample's length), "causal_padding" [B, 1, Lq, Lk] (the text
    encoder's: causal and padding, a row that sees nothing seeing everything), "float"
    [B, H, Lq, Lk] of finite values, "shared" [1, 1, Lq, Lk] of finite values."""
    lengths = rng.integers(1, lk + 1, size=b)
    padded = np.arange(lk)[None, :] >= lengths[:, None]
    if kind == "padding":
        mask = np.where(padded, -np.inf, 0.0)[:, None, None, :]
    elif kind == "causal_padding":
        hidden = (np.arange(lk)[None, :] > np.arange(lq)[:, None])[None] | padded[:, None, :]
        hidden = np.where(hidden.all(-1, keepdims=True), False, hidden)
        mask = np.where(hidden, -np.inf, 0.0)[:, None]
    elif kind == "float":
        mask = rng.standard_normal((b, h, lq, lk)) * 2
    else:
        mask = rng.standard_normal((1, 1, lq, lk)) * 2
    return mask.astype(DTYPES[dtype])


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 3), d=st.sampled_from([40, 64, 80, 160]),
       lq=st.sampled_from([1, 17, 77, 130]), lk=st.sampled_from([1, 8, 77, 129]),
       kind=st.sampled_from(["padding", "causal_padding", "float", "shared"]), strided=st.booleans(),
       dtype=st.sampled_from(list(BOUNDS)), seed=st.integers(0, 99))
def test_flash_attention_with_a_mask_matches_float64(b, h, d, lq, lk, kind, strided, dtype, seed) -> None:
    rng = np.random.default_rng(seed)
    (q, qd), (k, kd), (v, vd) = (heads(rng, b, h, n, d, dtype, strided) for n in (lq, lk, lk))
    mask = masks(rng, kind, b, h, lq, lk, dtype)
    maskd = cp.broadcast_to(tc.tensor(mask, device="cuda").data, (b, h, lq, lk))  # as the op passes it
    assert flash_attention.mask_fits(maskd, qd, kd)
    scale = 1 / math.sqrt(d)
    got = on_host(flash_attention.forward(qd, kd, vd, False, scale, mask=maskd))
    want = reference(q, k, v, False, scale, mask)
    assert np.abs(got - want).max() <= BOUNDS[dtype]


def test_a_row_a_mask_hides_every_key_from_is_nan_as_in_the_reference() -> None:
    rng = np.random.default_rng(3)
    (q, qd), (k, kd), (v, vd) = (heads(rng, 1, 2, n, 64, "float16", False) for n in (5, 9, 9))
    mask = np.zeros((1, 2, 5, 9), np.float16)
    mask[0, 1, 3] = -np.inf
    got = on_host(flash_attention.forward(qd, kd, vd, False, 0.125, mask=cp.asarray(mask)))
    want = reference(q, k, v, False, 0.125, mask)
    assert np.isnan(got[0, 1, 3]).all() and np.isnan(want[0, 1, 3]).all()
    got[0, 1, 3] = want[0, 1, 3] = 0
    assert np.abs(got - want).max() <= BOUNDS["float16"]


def test_masks_the_forward_cannot_read_are_refused() -> None:
    q = cp.zeros((2, 3, 16, 64), dtype=cp.float16)
    k = cp.zeros((2, 3, 20, 64), dtype=cp.float16)
    assert flash_attention.mask_fits(cp.broadcast_to(cp.zeros((2, 1, 1, 20), cp.float16), (2, 3, 16, 20)), q, k)
    assert not flash_attention.mask_fits(cp.zeros((2, 3, 16, 20), cp.float32), q, k)  # another dtype
    assert not flash_attention.mask_fits(cp.zeros((2, 3, 20, 16), cp.float16).swapaxes(2, 3), q, k)  # keys strided
    assert not flash_attention.mask_fits(cp.zeros((2, 1, 16, 20), cp.float16), q, k)  # not broadcast to [B, H, Lq, Lk]


@pytest.mark.parametrize("dtype", [tc.float16, tc.bfloat16])
def test_the_text_encoders_padding_mask_runs_in_flash_attention(dtype, monkeypatch) -> None:
    """CLIP's causal-and-padding mask (``clip_layers.attention_mask``) reaches the kernel
    as an additive mask; the encoder's output is the float32 CPU run's within the
    dtype's rounding."""
    from diffusion.models.clip_text import CLIPTextModel

    calls = []
    real = flash_attention.forward
    monkeypatch.setattr(flash_attention, "forward",
                        lambda *a, **kw: calls.append(kw.get("mask") is not None) or real(*a, **kw))
    tc.manual_seed(0)
    config = dict(vocab_size=100, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                  max_position_embeddings=16, pad_token_id=0, bos_token_id=98, eos_token_id=99)
    model = CLIPTextModel(**config).eval()
    ids = np.random.default_rng(0).integers(0, 100, size=(2, 16))
    padding = np.ones((2, 16), np.int64)
    padding[1, 9:] = 0
    with tc.no_grad():
        want = model(ids, attention_mask=padding).last_hidden_state.numpy()
        gpu = model.to("cuda").to(dtype=dtype)
        got = gpu(ids, attention_mask=padding).last_hidden_state.to(dtype=tc.float32).numpy()
    assert calls == [True, True]
    assert np.abs(got - want).max() <= (0.05 if dtype == tc.float16 else 0.2) * np.abs(want).max()


def test_unsupported_layouts_and_dtypes_are_refused() -> None:
    x = cp.zeros((1, 2, 16, 40), dtype=cp.float16)
    assert not flash_attention.fits(x.astype(cp.float32), x.astype(cp.float32), x.astype(cp.float32))
    assert not flash_attention.fits(x[..., :36], x[..., :36], x[..., :36])  # head dim not a multiple of 8
    assert not flash_attention.fits(x, x, cp.zeros((1, 2, 16, 64), dtype=cp.float16))  # v wider than q
    shifted = cp.zeros(x.size + 1, dtype=cp.float16)[1:].reshape(x.shape)
    assert not flash_attention.fits(shifted, x, x)  # a base off 16 bytes


@pytest.mark.parametrize("dtype", [tc.float16, tc.bfloat16])
def test_the_op_takes_flash_attention_without_gradients_and_graphs_replay_it(dtype, monkeypatch) -> None:
    calls = []
    real = flash_attention.forward
    monkeypatch.setattr(flash_attention, "forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    rng = np.random.default_rng(0)
    q, k, v = (tc.tensor(rng.standard_normal((2, 8, 256, 40)).astype(np.float32), device="cuda").to(dtype=dtype)
               for _ in range(3))
    with tc.no_grad():
        eager = F.scaled_dot_product_attention(q, k, v)
    assert calls == [1]
    want = reference(*(t.to(dtype=tc.float32).numpy() for t in (q, k, v)), False, 40 ** -0.5)
    assert np.abs(eager.to(dtype=tc.float32).numpy() - want).max() <= BOUNDS[str(dtype).split(".")[-1]]
    compiled = tc.compile(lambda a, b, c: F.scaled_dot_product_attention(a, b, c))
    with tc.no_grad():
        for _ in range(3):
            replayed = compiled(q, k, v)
    assert compiled.cache_info().hits >= 1
    np.testing.assert_array_equal(replayed.to(dtype=tc.float32).numpy(), eager.to(dtype=tc.float32).numpy())


@pytest.mark.parametrize("dtype", [tc.float16, tc.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_the_op_trains_through_flash_attention(dtype, causal, monkeypatch) -> None:
    """With gradients the op takes the forward kernel (saving lse) and the backward
    kernel; its gradients equal the NumPy backend's on the same rounded inputs."""
    calls = []
    real = flash_attention_bwd.backward
    monkeypatch.setattr(flash_attention_bwd, "backward", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(2)
    name = str(dtype).split(".")[-1]
    values = [rng.standard_normal(shape).astype(DTYPES[name]).astype(np.float32)
              for shape in ((2, 4, 150, 40), (2, 4, 90, 40), (2, 4, 90, 40), (2, 4, 150, 40))]

    def grads(device: str, dt):
        q, k, v = (tc.tensor(x, device=device).to(dtype=dt).requires_grad_(True) for x in values[:3])
        weight = tc.tensor(values[3], device=device).to(dtype=dt)
        (F.scaled_dot_product_attention(q, k, v, is_causal=causal) * weight).sum().backward()
        return [t.grad.to(dtype=tc.float32).numpy().astype(np.float64) for t in (q, k, v)]

    got = grads("cuda", dtype)
    assert calls == [1]
    for x, w in zip(got, grads("cpu", tc.float32)):
        assert relative_error(x, w) <= GRAD_BOUNDS[name]
