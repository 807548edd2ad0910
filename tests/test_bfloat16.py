"""bfloat16 tensors on every backend: stored in bfloat16, accumulated in float32.

References are float64 computations on the same (already bfloat16-rounded) inputs, so
the only expected error is the final rounding to bfloat16 (relative 2^-8) plus float32
accumulation.  Sums of ones past 256 tell float32 accumulation apart from bfloat16
accumulation, which stalls at 256 (256 + 1 is not a bfloat16).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import layers
import optim
import tensorcore as tc

BF16 = tc.bfloat16
RNG = np.random.default_rng(0)


def device_of(backend: str) -> str:
    return "cuda" if backend == "cupy" else "cpu"


def bf16_input(*shape: int, requires_grad: bool = False, device: str = "cpu") -> tc.Tensor:
    values = RNG.standard_normal(shape).astype(np.float32)
    return tc.tensor(values, device=device).to(BF16).requires_grad_(requires_grad)


def wide(t: tc.Tensor) -> np.ndarray:
    """A tensor's values (bfloat16 or not) as float64 on the host."""
    return np.asarray(t.detach().to(tc.float32).numpy(), dtype=np.float64)


def reference(fn, *tensors: tc.Tensor) -> tuple[np.ndarray, list[np.ndarray]]:
    """fn on float64 copies on the NumPy backend: (value, gradients of sum(value * 1))."""
    with tc.use_backend("numpy"):
        leaves = [tc.tensor(wide(t), requires_grad=t.requires_grad) for t in tensors]
        out = fn(*leaves)
        if any(t.requires_grad for t in leaves):
            out.sum().backward()
        return out.numpy(), [t.grad.numpy() for t in leaves if t.requires_grad]


def assert_bf16_close(got: tc.Tensor | np.ndarray, want: np.ndarray, rtol: float = 1e-2) -> None:
    got = wide(got) if isinstance(got, tc.Tensor) else np.asarray(got, dtype=np.float64)
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


def test_dtype_basics():
    x = tc.tensor([1.0, 2.5, -3.0], dtype=BF16)
    assert x.dtype == BF16 and str(x.dtype) == "bfloat16" and tc.dtypes.is_floating(BF16)
    assert x.numpy().dtype == BF16 and x.float().dtype == tc.float32
    assert tc.zeros(2, 3, dtype="bfloat16").dtype == BF16
    assert (x + tc.tensor([1.0], dtype=tc.float32)).dtype == tc.float32  # promotion as NumPy
    assert (x * 2.0).dtype == BF16  # Python scalars are weak
    assert x.requires_grad_().requires_grad
    assert tc.tensor([1.0, 1.0 + 2**-9], dtype=BF16).numpy().tolist() == [1.0, 1.0]  # rounds


def test_accumulation_is_float32(backend):
    dev = device_of(backend)
    ones = tc.ones(4096, dtype=BF16, device=dev)
    assert ones.sum().item() == 4096.0
    assert (ones.reshape(1, 4096) @ ones.reshape(4096, 1)).item() == 4096.0
    image = tc.ones(1, 512, 3, 3, dtype=BF16, device=dev)
    weight = tc.ones(1, 512, 3, 3, dtype=BF16, device=dev)
    assert tc.functional.conv2d(image, weight).item() == 4608.0  # 512 * 9 terms


def test_elementwise_chain(backend):
    dev = device_of(backend)
    x, a, b = (bf16_input(3, 1001, requires_grad=True, device=dev) for _ in range(3))
    fn = lambda x, a, b: tc.functional.silu(x * a + b) * x.exp() - b.tanh()  # noqa: E731
    out = fn(x, a, b)
    assert out.dtype == BF16
    out.sum().backward()
    want, grads = reference(fn, x, a, b)
    assert_bf16_close(out, want)
    for t, g in zip((x, a, b), grads):
        assert t.grad.dtype == BF16
        assert_bf16_close(t.grad, g, rtol=3e-2)  # the chain rounds each intermediate


@pytest.mark.parametrize("sa, sb", [((33, 70), (70, 5)), ((2, 1, 7, 300), (3, 300, 9))])
def test_matmul(backend, sa, sb):
    dev = device_of(backend)
    a, b = bf16_input(*sa, requires_grad=True, device=dev), bf16_input(*sb, requires_grad=True, device=dev)
    out = a @ b
    assert out.dtype == BF16
    out.sum().backward()
    want, (ga, gb) = reference(lambda a, b: a @ b, a, b)
    assert_bf16_close(out, want)
    assert_bf16_close(a.grad, ga)
    assert_bf16_close(b.grad, gb)


@pytest.mark.parametrize("stride, padding, groups", [(1, 1, 1), (2, 0, 2)])
def test_conv2d(backend, stride, padding, groups):
    dev = device_of(backend)
    x = bf16_input(2, 4, 9, 11, requires_grad=True, device=dev)
    w = bf16_input(6, 4 // groups, 3, 3, requires_grad=True, device=dev)
    fn = lambda x, w: tc.functional.conv2d(x, w, stride=stride, padding=padding, groups=groups)  # noqa: E731
    out = fn(x, w)
    assert out.dtype == BF16
    out.sum().backward()
    want, (gx, gw) = reference(fn, x, w)
    assert_bf16_close(out, want)
    assert_bf16_close(x.grad, gx)
    assert_bf16_close(w.grad, gw)


def test_softmax_and_norms(backend):
    dev = device_of(backend)
    x = bf16_input(4, 8, 5, 6, requires_grad=True, device=dev)
    mix = bf16_input(4, 8, 5, 6, device=dev)  # a cotangent: plain sums of normalised values have no gradient
    fn = lambda x, mix: (tc.softmax(x, -1) * 3 + tc.functional.layer_norm(x, (6,)) * 2  # noqa: E731
                         + tc.functional.group_norm(x, 4)) * mix
    out = fn(x, mix)
    assert out.dtype == BF16
    out.sum().backward()
    want, (gx,) = reference(fn, x, mix)
    assert_bf16_close(out, want)
    assert_bf16_close(x.grad, gx, rtol=3e-2)


def test_train_step_keeps_bfloat16(backend):
    """A bfloat16 model trains: parameters, gradients and optimizer updates stay bfloat16."""
    dev = device_of(backend)
    tc.manual_seed(0)
    model = layers.Sequential(layers.Conv2d(1, 4, 3, padding=1), layers.GroupNorm(2, 4), layers.SiLU(),
                              layers.Flatten(), layers.Linear(4 * 8 * 8, 3)).to(dev, dtype=BF16)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    x = bf16_input(16, 1, 8, 8, device=dev)
    target = tc.tensor(RNG.integers(0, 3, 16), device=dev)
    before = [wide(p) for p in model.parameters()]
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = tc.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(p.dtype == BF16 and p.grad.dtype == BF16 for p in model.parameters())
    assert all(not np.array_equal(b, wide(p)) for b, p in zip(before, model.parameters()))
    assert losses[-1] < losses[0]


def test_batch_norm_updates_bfloat16_running_stats(backend):
    """Running statistics are written in place even where the kernel computes on float32
    copies of them."""
    dev = device_of(backend)
    norm = layers.BatchNorm2d(3).to(dev, dtype=BF16)
    x = bf16_input(8, 3, 5, 5, device=dev) * 2 + 1
    norm(x)
    batch_mean = wide(x).mean(axis=(0, 2, 3))
    assert norm.running_mean.dtype == BF16
    np.testing.assert_allclose(wide(norm.running_mean), 0.1 * batch_mean, rtol=1e-2, atol=1e-3)


def test_clip_keeps_bfloat16(backend):
    """NumPy widens a bfloat16 array clipped by Python floats to float32; the op must not."""
    x = tc.tensor(np.linspace(-3, 3, 11, dtype=np.float32), device=device_of(backend)).to(dtype=tc.bfloat16)
    for got in (x.clip(-1.0, 1.0), tc.clip(x, min=-1.5), tc.clip(x, max=0.25)):
        assert got.dtype == tc.bfloat16
    np.testing.assert_array_equal(x.clip(-1.0, 1.0).to(dtype=tc.float32).numpy(),
                                  np.clip(np.linspace(-3, 3, 11, dtype=np.float32).astype(x.numpy().dtype), -1, 1)
                                  .astype(np.float32))


def test_where_and_the_nonfinite_guard_keep_bfloat16(backend):
    """where over two bfloat16 operands is bfloat16 (CuPy widens it to float32), so the
    pipelines' non-finite guard hands the next step a bfloat16 sample."""
    from diffusion.pipelines.guard import replace_nonfinite

    dev = device_of(backend)
    x = tc.tensor(np.array([1.0, np.nan, np.inf, -np.inf, -2.5], np.float32), device=dev).to(dtype=tc.bfloat16)
    picked = tc.where(x > 0, x, tc.zeros((), dtype=tc.bfloat16, device=dev))
    assert picked.dtype == tc.bfloat16
    clean, total = replace_nonfinite(x, tc.zeros((), dtype=tc.int64, device=dev))
    assert clean.dtype == tc.bfloat16
    big = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    np.testing.assert_array_equal(clean.to(dtype=tc.float32).numpy(), [1.0, 0.0, big, -big, -2.5])
    assert int(total.item()) == 3


@pytest.mark.parametrize("name", ["DDPMScheduler", "DDIMScheduler", "DPMSolverMultistepScheduler",
                                  "EulerDiscreteScheduler"])
def test_scheduler_steps_keep_a_bfloat16_sample(backend, name):
    """A bfloat16 model's sample stays bfloat16 through a step (the float32 tables are 0-d
    coefficients, as diffusers' are under PyTorch's promotion): a float32 sample would make
    the next model call compute in float32."""
    import diffusion

    scheduler = getattr(diffusion, name)()
    scheduler.set_timesteps(4)
    sample = tc.randn(1, 2, 4, 4, device=device_of(backend)).to(dtype=tc.bfloat16)
    model_input = scheduler.scale_model_input(sample, scheduler.timesteps[0])
    out = scheduler.step(model_input * 0.5, scheduler.timesteps[0], sample)
    assert out.prev_sample.dtype == tc.bfloat16


def test_ml_dtypes_is_imported_when_bfloat16_is_first_asked_for() -> None:
    """Importing ml_dtypes takes most of a second: the packages, float32 work, a compiled
    call and a saved file go without it; ``tc.bfloat16`` and the name "bfloat16" bring it."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys, tempfile, os
        import numpy as np
        import tensorcore as tc, layers, optim, diffusion, diffusion.cli
        from layers.serialization import load_file, save_file
        model = layers.Linear(3, 2)
        step = tc.compile(lambda x: model(x).sum())
        for _ in range(3):
            step(tc.randn(4, 3))
        path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
        save_file({"w": np.ones(3, np.float32)}, path)
        assert load_file(path)["w"].dtype == np.float32
        assert tc.dtypes.is_floating(tc.float16) and not tc.dtypes.is_bfloat16(tc.float16)
        assert "bfloat16" in dir(tc)
        print("ml_dtypes" in sys.modules)
        print(tc.tensor([1.5], dtype="bfloat16").dtype, "ml_dtypes" in sys.modules)
        from tensorcore.dtypes import bfloat16
        print(bfloat16 is tc.bfloat16 or bfloat16 == tc.bfloat16, tc.dtypes.is_bfloat16(bfloat16))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["False", "bfloat16 True", "True True"]


def test_dtype_checks_by_name_refuse_what_they_refused() -> None:
    assert tc.dtypes.as_dtype("bfloat16") == BF16 == tc.dtypes.as_dtype(ml_dtypes.bfloat16)
    for bad in (np.dtype(">f4"), "complex64", np.int16):
        with pytest.raises(TypeError, match="not supported"):
            tc.dtypes.as_dtype(bad)
    with pytest.raises(TypeError, match="supported dtype"):
        tc.tensor(np.ones(2, np.dtype(">f4")))
    assert tc.dtypes.promote_types(tc.float16, BF16) == tc.float32
    assert not tc.dtypes.is_bfloat16(None) and not tc.dtypes.is_bfloat16("bfloat16")
