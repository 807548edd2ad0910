"""Compiled calls hold what they replay: threads calling one compiled function over an
evicting cache (more input shapes than plans), with ``release()`` racing them, all get
whole, correct results -- an evicted or released plan is torn down only after the calls
replaying it have returned, and one plan is replayed by one thread at a time."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import layers
import tensorcore as tc

THREADS, CALLS, SHAPES = 8, 150, 8


def _inputs() -> list[np.ndarray]:
    return [np.arange(n * 3, dtype=np.float32).reshape(n, 3) / 7 for n in range(1, SHAPES + 1)]


def _hammer(call, check, release=None) -> list[str]:
    """Run ``call`` from THREADS threads over every input shape in turn (each thread
    starting at another shape); return what went wrong."""
    problems: list[str] = []
    inputs = _inputs()
    start = threading.Barrier(THREADS + (release is not None))
    stop = threading.Event()

    def worker(offset: int) -> None:
        start.wait()
        for i in range(CALLS):
            x = inputs[(i + offset) % SHAPES]
            try:
                problem = check(x, call(tc.tensor(x)))
            except Exception as exc:  # noqa: BLE001  (any exception is a finding)
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                problems.append(problem)

    def releaser() -> None:
        start.wait()
        while not stop.is_set():
            release()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    extra = [threading.Thread(target=releaser)] if release is not None else []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: races show up in few calls
    try:
        for t in threads + extra:
            t.start()
        for t in threads:
            t.join()
    finally:
        stop.set()
        for t in extra:
            t.join()
        sys.setswitchinterval(interval)
    return problems


def _check_pair(x: np.ndarray, out) -> str | None:
    if not isinstance(out, tuple) or len(out) != 2:
        return f"short result {out!r}"
    y, s = out
    if not np.array_equal(y.numpy(), x * 2 + 1) or not np.isclose(float(s.numpy()), x.sum(), rtol=1e-5):
        return "wrong values"
    return None


@pytest.mark.parametrize("racing_release", [False, True], ids=["evicting", "release-racing"])
def test_threads_over_an_evicting_cache(tmp_path, racing_release):
    @tc.compile(max_plans=2, cache_dir=tmp_path)
    def f(x):
        return x * 2 + 1, x.sum()

    problems = _hammer(f, _check_pair, f.release if racing_release else None)
    assert not problems, f"{len(problems)} bad calls, e.g. {problems[:3]}"
    assert f.cache_info().eager_only == 0  # no replay failed over to eager mode


def test_a_one_output_module_over_an_evicting_cache(tmp_path):
    model = layers.Linear(3, 2)
    compiled = tc.compile(model, max_plans=2, cache_dir=tmp_path)
    w, b = model.weight.numpy(), model.bias.numpy()

    def check(x: np.ndarray, out) -> str | None:
        if not isinstance(out, tc.Tensor) or out.shape != (x.shape[0], 2):
            return f"bad result {out!r}"
        return None if np.allclose(out.numpy(), x @ w.T + b, atol=1e-5) else "wrong values"

    with tc.no_grad():
        problems = _hammer(compiled, check, compiled.release)
    assert not problems, f"{len(problems)} bad calls, e.g. {problems[:3]}"
    assert compiled.cache_info().eager_only == 0
