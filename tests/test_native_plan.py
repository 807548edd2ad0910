"""Native plans on the Numba backend: runs of plan steps as one generated jitted call.

A compiled plan replays bit for bit as eager mode runs: the tiny MLP forward and Adam
step, a small conv net; the digits training step of the command line, too large to
compile on a cold cache, stays a Python loop, equal to eager as well.  The generated
segments call the steps' functions in plan order, and dropping or swapping one changes
the result (so the equality checks can fail).  NumPy's sums and matrix products, as
the segments run them, equal NumPy's bit for bit.  A second process loads a segment
from the disk cache without compiling it, also for a plan loaded from the plan cache.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

import layers
import optim
import tensorcore as tc
import tensorcore.functional as F

pytest.importorskip("numba")

from tensorcore.backends.numba import blas, native_plan, numpy_sums  # noqa: E402
from tensorcore.backends.numpy.executor import own_method  # noqa: E402

REPO = Path(tc.__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def numba_backend():
    with tc.use_backend("numba"):
        yield


def _mlp() -> layers.Module:
    tc.manual_seed(0)
    return layers.Sequential(layers.Linear(16, 32), layers.SiLU(), layers.Linear(32, 32), layers.GELU(),
                             layers.Linear(32, 4))


def _entry(compiled: tc.compile) -> object:
    (entry,) = compiled._plans.values()
    return entry


def _segments(compiled: tc.compile) -> list[native_plan.Segment]:
    return [s for s in _entry(compiled).executor.steps if isinstance(s, native_plan.Segment)]


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def test_the_tiny_mlp_forward_is_one_segment_equal_to_eager():
    model = _mlp().eval()
    compiled = tc.compile(model, cache_dir=False)
    x = tc.randn(2, 16)
    with tc.no_grad():
        compiled(x)
        for seed in range(3):
            x = tc.randn(2, 16) * (seed + 1)
            assert _bits(compiled(x).numpy()) == _bits(model(x).numpy())
    steps = _entry(compiled).executor.steps
    assert len(steps) == 1 and isinstance(steps[0], native_plan.Segment)


def _adam_run(compiled: bool, steps: int = 6) -> tuple[list, list, dict]:
    model = _mlp()
    opt = optim.Adam(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(3)

    def step(x: tc.Tensor, y: tc.Tensor) -> tc.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    run = tc.compile(step, cache_dir=False) if compiled else step
    losses = [run(tc.tensor(rng.standard_normal((2, 16)).astype(np.float32)),
                  tc.tensor(rng.standard_normal((2, 4)).astype(np.float32))).numpy() for _ in range(steps)]
    if compiled:
        assert run.cache_info().hits >= steps - 3
        assert _segments(run), "the step replays no native segment"
    return losses, [p.numpy().copy() for p in model.parameters()], opt.state_dict()


def test_the_tiny_mlp_adam_step_equals_eager_bit_for_bit():
    eager, compiled = _adam_run(False), _adam_run(True)
    assert [_bits(a) for a in eager[0]] == [_bits(a) for a in compiled[0]]
    assert [_bits(a) for a in eager[1]] == [_bits(a) for a in compiled[1]]
    for k, state in eager[2]["state"].items():
        for role, value in state.items():
            assert _bits(np.asarray(value)) == _bits(np.asarray(compiled[2]["state"][k][role])), (k, role)


def _conv_net() -> layers.Module:
    tc.manual_seed(1)
    return layers.Sequential(layers.Conv2d(3, 8, 3, padding=1), layers.GroupNorm(2, 8), layers.SiLU(),
                             layers.Conv2d(8, 4, 3, padding=1), layers.SiLU(), layers.Flatten(),
                             layers.Linear(256, 5))


def test_a_small_conv_net_trains_as_eager_with_python_steps_between_segments():
    results = []
    for compiled in (False, True):
        model = _conv_net()
        opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)

        def step(x: tc.Tensor, y: tc.Tensor) -> tc.Tensor:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        run = tc.compile(step, cache_dir=False) if compiled else step
        rng = np.random.default_rng(0)
        losses = []
        for i in range(5):
            if i == 3:
                native_plan.wait()
            losses.append(run(tc.tensor(rng.standard_normal((2, 3, 8, 8)).astype(np.float32)),
                              tc.tensor(rng.integers(0, 5, 2))).numpy())
        results.append((losses, [p.numpy().copy() for p in model.parameters()]))
        if compiled:
            steps = _entry(run).executor.steps
            assert any(isinstance(s, native_plan.Segment) for s in steps)
            assert any(not isinstance(s, native_plan.Segment) for s in steps)  # the convolutions
    (eager_losses, eager_params), (losses, params) = results
    assert [_bits(a) for a in losses] == [_bits(a) for a in eager_losses]
    assert [_bits(a) for a in params] == [_bits(a) for a in eager_params]


def test_the_digits_training_step_stays_a_python_loop_equal_to_eager(tmp_path, monkeypatch):
    """Its plan misses far more segments than ``BACKGROUND_COMPILES`` on a cold cache, so
    it replays its Python steps (minutes of compiling would slow the steps meanwhile)."""
    monkeypatch.setenv("TENSORCORE_CACHE_DIR", str(tmp_path))  # a cold cache of segments
    from diffusion import DDPMScheduler, UNet2D
    from diffusion.cli.digits import unet_config
    from diffusion.datasets import digit_images
    from diffusion.training import ddpm_trainer

    data = digit_images(8)
    params = []
    for mode in (False, True):
        tc.manual_seed(0)
        unet = UNet2D(**unet_config(8, (32, 64), 1, 1)).train()
        trainer = ddpm_trainer(unet, DDPMScheduler(beta_schedule="squaredcos_cap_v2"), data, steps=6, batch_size=8,
                               grad_clip=1.0, ema_decay=0.999, checkpoint_every=None, progress=False, compile=mode)
        for _ in range(6):
            trainer.train_step()
        if mode:
            native_plan.wait()
            assert trainer.compile_info.hits >= 3
            assert not _segments(trainer._compiled_step)
        params.append([p.numpy().copy() for p in unet.parameters()])
    assert [_bits(a) for a in params[0]] == [_bits(a) for a in params[1]]


# ----- order: the segment runs the plan's calls, all of them, in order -------------------
def _forward_forms() -> tuple[tc.compile, tc.Tensor, list]:
    model = _mlp().eval()
    compiled = tc.compile(model, cache_dir=False)
    x = tc.randn(2, 16)
    with tc.no_grad():
        compiled(x)
    entry = _entry(compiled)
    plan, executor = entry.plan, entry.executor
    native = own_method(tc.get_backend(), "native")
    forms = [executor._native_form(plan, native, plan.graph.nodes[p]) for p in plan.steps]
    assert all(form for form in forms)
    return compiled, x, forms


def test_the_segment_calls_each_steps_functions_in_plan_order():
    compiled, _, forms = _forward_forms()
    (segment,) = _segments(compiled)
    called = re.findall(r"^\s+(?:\w+\[\.\.\.\] = )?(\w+)\(", segment.text, re.MULTILINE)
    called = [name for name in called if name != "swap_thread_count"]
    assert called == [call.name for form in forms for call in form]
    assert [call.name for call in forms[0]] == ["blas_gemm", "activations_bias_act_rows_"]


def test_a_dropped_or_swapped_step_changes_the_result():
    compiled, x, forms = _forward_forms()
    entry = _entry(compiled)
    with tc.no_grad():
        want = compiled(x).numpy()
    executor = entry.executor
    out = executor.outputs[0]

    def run(calls: list) -> np.ndarray:
        executor.memory[len(executor.memory) - executor.arena_bytes:] = 0  # no value left by an earlier run
        executor.inputs[0][...] = x.numpy()
        native_plan.Segment(calls)()
        return out.copy()

    assert _bits(run([c for form in forms for c in form])) == _bits(want)
    dropped = [c for form in forms[:1] + forms[2:] for c in form]
    assert _bits(run(dropped)) != _bits(want)
    swapped = [c for form in (forms[1], forms[0], forms[2]) for c in form]
    assert _bits(run(swapped)) != _bits(want)


# ----- NumPy's arithmetic, as the segments run it -------------------------------------
@given(st.integers(1, 20000), st.sampled_from([np.float32, np.float64]), st.integers(0, 2**32 - 1))
def test_full_sums_add_as_numpy_does(n, dtype, seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 4, n)).astype(dtype)
    out = np.empty(1, dtype)
    numpy_sums.full_sum(a, out)
    assert _bits(out[0]) == _bits(np.sum(a))


@given(st.integers(1, 300), st.integers(2, 70), st.sampled_from([np.float32, np.float64]),
       st.integers(0, 2**32 - 1))
def test_leading_sums_add_as_numpy_does(rows, cols, dtype, seed):
    a = np.random.default_rng(seed).standard_normal((rows, cols)).astype(dtype)
    out = np.empty(cols, dtype)
    numpy_sums.leading_sum(a, out)
    assert _bits(out) == _bits(np.sum(a, axis=0))


def test_sums_start_from_zero_as_numpy_does():
    zeros = -np.zeros((3, 2), np.float32)
    full, lead = np.empty(1, np.float32), np.empty(2, np.float32)
    numpy_sums.full_sum(zeros.reshape(-1), full)
    numpy_sums.leading_sum(zeros, lead)
    assert _bits(full[0]) == _bits(np.sum(zeros)) and _bits(lead) == _bits(np.sum(zeros, axis=0))


@given(st.integers(2, 40), st.integers(2, 40), st.integers(2, 40), st.booleans(), st.booleans(),
       st.sampled_from([np.float32, np.float64]), st.integers(0, 2**32 - 1))
def test_the_native_matrix_product_is_numpys(m, n, p, a_transposed, b_transposed, dtype, seed):
    if blas.gemm_address(np.dtype(dtype).name) is None:
        pytest.skip("NumPy does not use its bundled OpenBLAS here")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, m) if a_transposed else (m, n)).astype(dtype)
    b = rng.standard_normal((p, n) if b_transposed else (n, p)).astype(dtype)
    a, b = (a.T if a_transposed else a), (b.T if b_transposed else b)
    out = np.empty((m, p), dtype)
    native_plan.Segment([native_plan.gemm_call(a, b, out)])()
    assert _bits(out) == _bits(np.matmul(a, b))


def test_products_numpy_computes_otherwise_have_no_native_form():
    a = np.ones((4, 3), np.float32)
    assert native_plan.gemm_call(a, a.T, np.empty((4, 4), np.float32)) is None  # syrk
    assert native_plan.gemm_call(a[:1], a.T, np.empty((1, 4), np.float32)) is None  # a vector
    assert native_plan.gemm_call(a, a.T.astype(np.float64), np.empty((4, 4), np.float64)) is None


def test_a_stack_of_matrices_times_one_is_one_native_product_equal_to_the_backends():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 5, 7)).astype(np.float32)
    b = rng.standard_normal((4, 7)).astype(np.float32).T  # a Linear's weight, transposed
    out = np.empty((3, 5, 4), np.float32)
    call = native_plan.gemm_call(a, b, out)
    if blas.gemm_address("float32") is None:
        pytest.skip("NumPy does not use its bundled OpenBLAS here")
    assert call is not None
    native_plan.Segment([call])()
    assert _bits(out) == _bits(tc.get_backend().matmul(a, b))


def test_the_tiny_mlp_on_a_batch_of_sequences_is_one_segment_equal_to_eager():
    model = _mlp().eval()
    compiled = tc.compile(model, cache_dir=False)
    with tc.no_grad():
        for seed in range(3):
            x = tc.randn(2, 3, 16) * (seed + 1)
            assert _bits(compiled(x).numpy()) == _bits(model(x).numpy())
    steps = _entry(compiled).executor.steps
    assert len(steps) == 1 and isinstance(steps[0], native_plan.Segment)


# ----- the disk cache ---------------------------------------------------------------------
SCRIPT = """
import json, sys
import numpy as np
import layers, tensorcore as tc
from tensorcore.backends.numba import native_plan
tc.manual_seed(0)
model = layers.Sequential(layers.Linear(16, 32), layers.SiLU(), layers.Linear(32, 4)).eval()
compiled = tc.compile(model, cache_dir=sys.argv[1])
x = tc.randn(3, 16)
with tc.no_grad():
    got = compiled(x).numpy()
    got = compiled(x).numpy()
    want = model(x).numpy()
(entry,) = compiled._plans.values()
segments = [s for s in entry.executor.steps if isinstance(s, native_plan.Segment)]
print(json.dumps({"equal": got.tobytes() == want.tobytes(), "origins": [s.origin for s in segments],
                  "disk_loads": compiled.cache_info().disk_loads}))
"""


def test_a_second_process_loads_the_segment_from_the_disk_cache(tmp_path):
    env = dict(os.environ, TENSORCORE_BACKEND="numba", TENSORCORE_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "plans")], env=env, capture_output=True,
                             text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["equal"] and second["equal"]
    assert first["origins"] == ["compiled"] and first["disk_loads"] == 0
    assert second["disk_loads"] == 1  # the plan came from the plan cache, and binds its segment the same way
    assert second["origins"] == ["disk"]  # machine code loaded, not compiled
    assert list((tmp_path / "cache").rglob("native_*.py"))
