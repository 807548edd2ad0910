"""``await compiled.call_async(...)`` and ``tc.chain``: async results equal sync ones bit for
bit, cancellation lands at plan boundaries and leaves the callable correct, a chain equals
its stages run by hand, and each stage keeps its own cache and invalidation."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings

import numpy as np
import pytest

import layers
import tensorcore as tc
from tensorcore.compile import Compiled, host_effect


def _same(a: tc.Tensor, b: tc.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.numpy(), b.numpy())


def _mlp(seed: int = 0, width: int = 8) -> layers.Sequential:
    tc.manual_seed(seed)
    return layers.Sequential(layers.Linear(4, width), layers.SiLU(), layers.Linear(width, 4))


class Slow:
    """A host effect that counts replays and, when armed, holds the call for a while after
    telling the test it has started (so a cancellation arrives mid-call)."""

    def __init__(self) -> None:
        self.calls = 0
        self.armed = False
        self.started = threading.Event()

    def __call__(self) -> None:
        self.calls += 1
        if self.armed:
            self.started.set()
            time.sleep(0.05)


def accumulating(slow: Slow):
    """A compiled function with state: each call adds x into ``total`` and returns 2 * total."""
    total = tc.zeros(3)

    def step(x):
        host_effect(slow)
        total.add_(x)
        return total * 2

    return tc.compile(step, cache_dir=False), total


async def _started(slow: Slow) -> None:
    while not slow.started.is_set():
        await asyncio.sleep(0.001)


def cancelled_mid_call_then_again(slow: Slow, call) -> tc.Tensor:
    """Cancel the coroutine ``call()`` while ``slow`` holds it (CancelledError expected),
    then await ``call()`` again; returns the second result."""
    async def scenario():
        slow.armed = True
        task = asyncio.ensure_future(call())
        await _started(slow)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        slow.armed = False
        return await call()

    return asyncio.run(scenario())


# ----- call_async ---------------------------------------------------------------------------
def test_call_async_is_bit_identical_to_a_plain_call(backend):
    model = _mlp()
    compiled = tc.compile(model, cache_dir=False)
    xs = [tc.randn(5, 4) for _ in range(3)]
    with tc.no_grad():
        expected = [model(x) for x in xs]

        async def calls():
            first = await compiled.call_async(xs[0])  # traced
            rest = [await compiled.call_async(x) for x in xs[1:]]  # replayed
            return [first, *rest]

        results = asyncio.run(calls())
        assert all(_same(r, e) for r, e in zip(results, expected))
        assert _same(compiled(xs[0]), results[0])
    info = compiled.cache_info()
    assert (info.traces, info.hits, info.fallbacks) == (1, 3, 0)


def test_concurrent_calls_each_get_their_own_result(backend):
    compiled = tc.compile(lambda x, y: (tc.tanh(x) * y, x - y), cache_dir=False)
    pairs = [(tc.randn(4, 3), tc.randn(4, 3)) for _ in range(5)]
    expected = [compiled(x, y=y) for x, y in pairs]

    async def together():
        return await asyncio.gather(*(compiled.call_async(x, y=y) for x, y in pairs))

    for result, wanted in zip(asyncio.run(together()), expected):
        assert all(_same(r, w) for r, w in zip(result, wanted))
    assert compiled.cache_info().traces == 1


def test_cpu_calls_run_in_the_callables_worker_with_the_callers_grad_mode():
    threads = []
    model = _mlp()

    def forward(x):
        host_effect(lambda: threads.append(threading.current_thread().name))
        return model(x)

    compiled = tc.compile(forward, cache_dir=False)
    x = tc.randn(2, 4)
    with tc.no_grad():
        compiled(x)
        out = asyncio.run(compiled.call_async(x))
    assert not out.requires_grad
    assert compiled.cache_info().traces == 1  # the worker saw no_grad: same key, replayed
    assert threads[0] == threading.current_thread().name and threads[1].startswith("tc-async-")


def test_the_event_loop_keeps_running_during_a_cpu_call():
    slow = Slow()
    compiled, _ = accumulating(slow)
    compiled(tc.ones(3))
    slow.armed = True  # the replay holds the worker for 50 ms

    async def scenario():
        ticks = 0
        task = asyncio.ensure_future(compiled.call_async(tc.ones(3)))
        while not task.done():
            ticks += 1
            await asyncio.sleep(0.001)
        return ticks

    assert asyncio.run(scenario()) >= 5  # a blocked loop would tick once or twice


def test_cancelled_call_completes_its_plan_and_the_next_call_is_right():
    slow = Slow()
    compiled, total = accumulating(slow)
    x = tc.tensor([1.0, 2.0, 3.0])
    compiled(x)  # traced: total = x

    after = cancelled_mid_call_then_again(slow, lambda: compiled.call_async(x))
    assert slow.calls == 3  # trace, the cancelled replay (run to its end), the next one
    assert np.array_equal(after.numpy(), 2 * 3 * x.numpy()) and np.array_equal(total.numpy(), 3 * x.numpy())
    info = compiled.cache_info()
    assert (info.traces, info.hits, info.fallbacks) == (1, 2, 0)


def test_cancelled_before_it_runs_a_call_runs_nothing():
    slow = Slow()
    compiled, total = accumulating(slow)
    x = tc.ones(3)
    compiled(x)

    async def scenario():
        slow.armed = True
        running = asyncio.ensure_future(compiled.call_async(x))
        await _started(slow)
        queued = asyncio.ensure_future(compiled.call_async(x))  # waits behind the running call
        await asyncio.sleep(0.005)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        never = asyncio.ensure_future(compiled.call_async(x))
        never.cancel()  # cancelled before it started
        with pytest.raises(asyncio.CancelledError):
            await never
        return await running

    out = asyncio.run(scenario())
    assert slow.calls == 2 and np.array_equal(total.numpy(), 2 * x.numpy())
    assert np.array_equal(out.numpy(), 4 * x.numpy())


@pytest.mark.gpu
def test_gpu_call_async_polls_an_event_and_survives_cancellation():
    def heavy(x, w):  # ~1 TFLOP: still running when the cancellation arrives
        for _ in range(8):
            x = tc.tanh(x @ w)
        return x

    with tc.use_backend("cupy"):
        compiled = tc.compile(heavy, cache_dir=False)
        x, w = tc.randn(4096, 4096, device="cuda"), tc.randn(4096, 4096, device="cuda") * 0.01
        with tc.no_grad():
            compiled(x, w)  # traced
            expected = compiled(x, w)  # replayed

            async def scenario():
                ticks = 0
                task = asyncio.ensure_future(compiled.call_async(x, w))
                while not task.done():  # the loop keeps running while the GPU works
                    ticks += 1
                    await asyncio.sleep(0)
                cancelled = asyncio.ensure_future(compiled.call_async(x, w))
                await asyncio.sleep(0)  # launched, now polling
                cancelled.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await cancelled
                return task.result(), await compiled.call_async(x, w), ticks

            first, after, ticks = asyncio.run(scenario())
    assert _same(first, expected) and _same(after, expected) and ticks >= 10
    info = compiled.cache_info()
    assert (info.traces, info.hits, info.fallbacks) == (1, 4, 0)


@pytest.mark.gpu
def test_gpu_callers_on_two_streams_each_get_their_own_outputs():
    import cupy

    def heavy(x):
        for _ in range(4):
            x = tc.tanh(x @ x) * 0.5
        return x

    with tc.use_backend("cupy"), tc.no_grad():
        compiled = tc.compile(heavy, cache_dir=False)
        xs = [tc.randn(2048, 2048, device="cuda") * 0.02 for _ in range(6)]
        compiled(xs[0])  # traced
        expected = [compiled(x).numpy() for x in xs]  # one at a time (numpy() waits)
        streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
        outs = []
        for i, x in enumerate(xs):  # alternate streams, no host synchronization in between
            with streams[i % 2]:
                outs.append(compiled(x))
        cupy.cuda.Device().synchronize()
    assert all(np.array_equal(out.numpy(), want) for out, want in zip(outs, expected))


# ----- chain -----------------------------------------------------------------------------------
def _stages():
    first, last = _mlp(1), _mlp(2)

    def middle(h, scale, shift):
        return tc.tanh(h) * scale + shift

    return first, middle, last


def test_chain_with_side_inputs_equals_the_stages_by_hand(backend):
    first, middle, last = _stages()
    chained = tc.chain(tc.compile(first, cache_dir=False), tc.compile(middle, cache_dir=False),
                       tc.compile(last, cache_dir=False))
    with tc.no_grad():
        for _ in range(3):
            x, shift = tc.randn(3, 4), tc.randn(3, 4)
            side = [None, {"scale": 0.5, "shift": shift}, {}]
            expected = last(middle(first(x), scale=0.5, shift=shift))
            assert _same(chained(x, side_inputs=side), expected)
            assert _same(asyncio.run(chained.call_async(x, side_inputs=side)), expected)
    assert [(i.traces, i.hits, i.fallbacks) for i in chained.cache_info()] == [(1, 5, 0)] * 3


def test_plain_stages_are_compiled(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORCORE_CACHE_DIR", str(tmp_path))
    first, middle, last = _stages()
    chained = tc.chain(first, middle, last)
    assert len(chained) == 3 and all(isinstance(stage, Compiled) for stage in chained.stages)
    x, side = tc.randn(2, 4), [{}, {"scale": 2.0, "shift": tc.zeros(4)}, None]
    with tc.no_grad():
        assert _same(chained(x, side_inputs=side), last(middle(first(x), 2.0, tc.zeros(4))))
        chained(x, side_inputs=side)
    assert [i.hits for i in chained.cache_info()] == [1, 1, 1]
    assert repr(chained) == "tc.chain(Sequential, _stages.<locals>.middle, Sequential)"


def test_changing_one_stage_retraces_that_stage_alone(backend):
    first, middle, last = _stages()
    chained = tc.chain(*(tc.compile(s, cache_dir=False) for s in (first, middle, last)))
    x, side = tc.randn(2, 4), [None, {"scale": 1.5, "shift": tc.ones(4)}, None]
    with tc.no_grad():
        chained(x, side_inputs=side)
        last[2].weight = layers.Parameter(tc.randn(4, 8))  # a parameter replaced: structure changes
        after = chained(x, side_inputs=side)
        assert _same(after, last(middle(first(x), 1.5, tc.ones(4))))
        first._structure_changed()
        asyncio.run(chained.call_async(x, side_inputs=side))
    assert [i.traces for i in chained.cache_info()] == [2, 1, 2]
    assert [i.hits for i in chained.cache_info()] == [1, 2, 1]


def test_a_stage_falling_back_to_eager_leaves_the_others_replaying():
    first, _, last = _stages()

    def host_read(h):
        return h * float(h.abs().max())  # reads a value to the host: cannot be traced

    chained = tc.chain(tc.compile(first, cache_dir=False), tc.compile(host_read, cache_dir=False, fallback="eager"),
                       tc.compile(last, cache_dir=False))
    x = tc.randn(2, 4)
    with tc.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", tc.compile.CompileWarning)
        outs = [chained(x), chained(x), asyncio.run(chained.call_async(x))]
        expected = last(host_read(first(x)))
    assert all(_same(out, expected) for out in outs)
    infos = chained.cache_info()
    assert infos[1].eager_only == 1 and infos[1].fallbacks >= 2
    assert [(infos[i].traces, infos[i].hits, infos[i].fallbacks) for i in (0, 2)] == [(1, 2, 0)] * 2


def test_a_cancelled_chain_stops_at_the_next_stage_boundary():
    slow = Slow()
    stage, total = accumulating(slow)
    last = tc.compile(lambda y: y + 1, cache_dir=False)
    chained = tc.chain(stage, last)
    x = tc.ones(3)
    chained(x)

    after = cancelled_mid_call_then_again(slow, lambda: chained.call_async(x))
    assert last.cache_info().hits == 1  # the cancelled chain never reached the second stage
    assert np.array_equal(after.numpy(), 2 * 3 * x.numpy() + 1) and slow.calls == 3


def test_chain_arguments_are_checked_before_any_stage_runs():
    slow = Slow()
    stage, total = accumulating(slow)
    chained = tc.chain(stage, lambda y: y)
    x = tc.ones(3)
    with pytest.raises(ValueError, match=r"side_inputs must hold one entry per stage \(2\), got 1"):
        chained(x, side_inputs=[{}])
    with pytest.raises(TypeError, match=r"side_inputs\[1\] must be a dict"):
        chained(x, side_inputs=[{}, 3])
    with pytest.raises(TypeError, match="side_inputs must be a list"):
        asyncio.run(chained.call_async(x, side_inputs={"a": 1}))
    assert slow.calls == 0 and np.array_equal(total.numpy(), np.zeros(3))
    with pytest.raises(ValueError, match="at least one stage"):
        tc.chain()
    with pytest.raises(TypeError, match="stage 1 must be"):
        tc.chain(stage, 3)


@pytest.mark.gpu
def test_gpu_chain_queues_stages_back_to_back():
    with tc.use_backend("cupy"):
        first, middle, last = (_mlp(1).to("cuda"), lambda h, shift: tc.tanh(h) + shift, _mlp(2).to("cuda"))
        chained = tc.chain(*(tc.compile(s, cache_dir=False) for s in (first, middle, last)))
        x, shift = tc.randn(64, 4, device="cuda"), tc.randn(64, 4, device="cuda")
        side = [None, {"shift": shift}, None]
        with tc.no_grad():
            expected = last(middle(first(x), shift))
            outs = [chained(x, side_inputs=side), asyncio.run(chained.call_async(x, side_inputs=side))]
            outs.append(asyncio.run(chained.call_async(x, side_inputs=side)))
    assert all(_same(out, expected) for out in outs)
    assert [i.fallbacks for i in chained.cache_info()] == [0, 0, 0]
