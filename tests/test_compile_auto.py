"""``Module.eval(auto_compile=True)``: eval-mode calls under no_grad replay a compiled
inference plan (traced on the first such call); grad-mode and training calls stay eager."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import layers
import tensorcore as tc


def _model() -> layers.Sequential:
    tc.manual_seed(0)
    return layers.Sequential(layers.Linear(4, 16), layers.SiLU(), layers.Dropout(0.5), layers.Linear(16, 2))


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORCORE_CACHE_DIR", str(tmp_path / "cache"))


def _counts(model):
    """(plans made: traced or loaded from disk, replays)."""
    info = model._inference_plan().cache_info()
    return info.misses, info.hits


def test_eval_auto_compile_replays_the_inference_plan(backend):
    model = _model().eval(auto_compile=True)
    x = tc.randn(3, 4)
    with tc.no_grad():
        expected = model.forward(x)
        outs = [model(x), model(x), model(x * 2)]
    assert all(np.array_equal(o.numpy(), e.numpy()) for o, e in zip(outs, [expected, expected, model.forward(x * 2)]))
    assert _counts(model) == (1, 2)


def test_grad_mode_and_training_calls_stay_eager_and_a_round_trip_replays():
    model = _model().eval(auto_compile=True)
    x = tc.randn(3, 4)
    with tc.no_grad():
        model(x)
    out = model(x)  # grad enabled: eager, with a graph
    out.sum().backward()
    assert model[0].weight.grad is not None
    model.train()
    with tc.no_grad():
        first, second = model(x), model(x)  # dropout draws: training runs eagerly
    assert not np.array_equal(first.numpy(), second.numpy())
    model.eval()  # auto_compile stays on; the eval plan is still valid
    with tc.no_grad():
        model(x)
    assert _counts(model) == (1, 1)


def test_auto_compile_off_copies_and_checks():
    model = _model().eval(auto_compile=True)
    x = tc.randn(2, 4)
    with tc.no_grad():
        model(x)
        twin = copy.deepcopy(model)  # keeps the setting, makes its own plan
        assert np.array_equal(twin(x).numpy(), model(x).numpy())
        assert twin._inference_plan() is not model._inference_plan() and _counts(twin) == (1, 0)
        plan = model._inference_plan()
        model.eval(auto_compile=False)
        model(x)
    assert plan.cache_info().plans == 0 and "forward" not in model.__dict__["_compiled_calls"]
    with pytest.raises(TypeError, match="auto_compile must be a bool or None, got 'yes'"):
        model.eval(auto_compile="yes")
