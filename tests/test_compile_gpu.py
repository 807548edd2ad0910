"""tc.compile on the GPU: one CUDA graph per plan, memory flat over 1000 replays, plans
freed by release(), per-call scalars as device inputs, callers on their own streams.

(The op, layer, train-step and safety tests also run on CuPy through the ``backend``
fixture; these cover what only the GPU path has.)"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import layers
import optim
import tensorcore as tc
import tensorcore.functional as F

pytestmark = pytest.mark.gpu


def _block() -> layers.Module:
    """A UNet-style residual block with a timestep input and self-attention."""

    class Block(layers.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = layers.GroupNorm(4, 16)
            self.conv = layers.Conv2d(16, 16, 3, padding=1)
            self.time = layers.Linear(8, 16)
            self.attn = layers.MultiHeadAttention(16, 2, batch_first=True)

        def forward(self, x: tc.Tensor, t: tc.Tensor) -> tc.Tensor:
            freqs = tc.tensor(np.linspace(0.1, 1.0, 4, dtype=np.float32), device=x.device)
            emb = tc.cat([tc.sin(t.reshape(-1, 1) * freqs), tc.cos(t.reshape(-1, 1) * freqs)], axis=-1)
            h = self.conv(F.silu(self.norm(x))) + self.time(emb).reshape(-1, 16, 1, 1)
            tokens = h.flatten(2).transpose(1, 2)
            out, _ = self.attn(tokens, need_weights=False)
            return x + out.transpose(1, 2).reshape(h.shape)

    tc.manual_seed(0)
    return Block().to("cuda").eval()


def test_block_replays_one_graph_for_every_timestep():
    from tensorcore.backends.cupy.executor import CudaGraphReplay  # imports CuPy: only on the GPU

    block = _block()
    compiled = tc.compile(block, cache_dir=False)
    x = tc.randn(2, 16, 8, 8, device="cuda")
    with tc.no_grad():
        for step in (999.0, 500.0, 1.0):
            t = tc.tensor([step, step], device="cuda")
            assert np.array_equal(compiled(x, t).numpy(), block(x, t).numpy())
    info = compiled.cache_info()
    assert info.traces == 1 and info.hits == 2
    executor = compiled._plans.values()[0].executor
    assert isinstance(executor, CudaGraphReplay) and executor.graph is not None


def test_memory_is_flat_over_1000_replays():
    block = _block()
    compiled = tc.compile(block, cache_dir=False, reuse_outputs=True)
    x, t = tc.randn(1, 16, 8, 8, device="cuda"), tc.tensor([10.0], device="cuda")
    with tc.no_grad():
        for _ in range(3):
            compiled(x, t)
        tc.cuda.synchronize()
        before = tc.cuda.memory_allocated()
        for _ in range(1000):
            compiled(x, t)
        tc.cuda.synchronize()
        assert tc.cuda.memory_allocated() == before


def test_memory_counters_count_the_plans_own_pool_while_the_plan_lives():
    import cupy

    from tensorcore.backends.cupy.pools import private_pools

    block = _block()
    x, t = tc.randn(1, 16, 8, 8, device="cuda"), tc.tensor([10.0], device="cuda")
    with tc.no_grad():
        block(x, t)
    tc.cuda.synchronize()
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    before, private_before = tc.cuda.memory_reserved(), len(private_pools())
    compiled = tc.compile(block, cache_dir=False)
    with tc.no_grad():
        for _ in range(3):
            out = compiled(x, t)
    tc.cuda.synchronize()
    plan_bytes = sum(pool.total_bytes() for pool in private_pools())
    assert len(private_pools()) > private_before and plan_bytes > 0
    assert tc.cuda.memory_reserved() >= before + plan_bytes
    del compiled, out
    gc.collect()
    assert len(private_pools()) == private_before


def test_outputs_nobody_holds_are_handed_out_again_and_held_ones_never():
    """A loop feeding each call's outputs to the next gets the sets of two calls back
    in turn (no allocation), with every result as eager computes it; outputs still
    held -- as tensors or through a view -- keep their values over later calls."""
    def step(x, count):
        y = x * 0.5 + 1.0
        return y, count + (y > 1.5).sum()

    compiled = tc.compile(step, cache_dir=False)
    x, count = tc.randn(64, device="cuda"), tc.zeros((), dtype=tc.int64, device="cuda")
    want_x, want_count, seen = x, count, []
    for _ in range(8):
        x, count = compiled(x, count)
        want_x, want_count = step(want_x, want_count)
        assert np.array_equal(x.numpy(), want_x.numpy()) and count.item() == want_count.item()
        seen.append(id(x.data))
    assert len(set(seen[2:])) == 2, "later calls take back the sets of two calls before"
    kept = [compiled(x, count) for _ in range(3)]  # all held: each call has its own arrays
    view = compiled(x, count)[0][:4]  # a view keeps its base
    values = [k[0].numpy().copy() for k in kept] + [view.numpy().copy()]
    for _ in range(4):
        compiled(x * 3.0, count)
    assert all(np.array_equal(k[0].numpy(), v) for k, v in zip(kept, values))
    assert np.array_equal(view.numpy(), values[-1])


def test_release_frees_the_graph_and_its_pool():
    block = _block()
    compiled = tc.compile(block, cache_dir=False)
    x, t = tc.randn(1, 16, 8, 8, device="cuda"), tc.tensor([3.0], device="cuda")
    with tc.no_grad():
        compiled(x, t)
        executor = compiled._plans.values()[0].executor
        held = executor.pool.total_bytes()  # live buffers and the blocks the capture freed
        assert held > 64 * 1024 and compiled.plan_info()[0]["arena_bytes"] > 0
        compiled.release()
        tc.cuda.synchronize()
        # the buffers the backend kept for the capture's stream (GroupNorm's arrival
        # counters) go too: at most a few KiB may stay in the pool
        assert executor.pool.total_bytes() <= 64 * 1024 < held and executor.graph is None
        assert np.array_equal(compiled(x, t).numpy(), block(x, t).numpy())


def test_a_plan_dropped_without_release_leaves_the_backend_no_buffers_of_its_stream():
    """The backend's buffers for a plan's stream live in the plan's pool: kept past the
    plan, they would be freed memory handed to the next stream that reuses the handle.
    (The convolutions' scratch of a capture is the plan pool's own: never kept.)"""
    from tensorcore.backends.cupy import conv_igemm, counters

    compiled = tc.compile(_block(), cache_dir=False)
    x, t = tc.randn(1, 16, 8, 8, device="cuda"), tc.tensor([3.0], device="cuda")
    with tc.no_grad():
        compiled(x, t)
    stream = compiled._plans.values()[0].executor.stream.ptr
    assert any(key[1] == stream for key in counters._held)
    assert not any(key[1] == stream for key in conv_igemm._scratch)
    del compiled
    gc.collect()
    assert not any(key[1] == stream for key in (*counters._held, *conv_igemm._scratch))


def test_callers_on_their_own_streams():
    import cupy

    compiled = tc.compile(lambda x: tc.tanh(x) * 2 + 1, cache_dir=False)
    xs = [tc.randn(1 << 16, device="cuda") for _ in range(4)]
    compiled(xs[0])
    tc.cuda.synchronize()  # the inputs were drawn on the default stream: non-blocking ones don't wait
    outs = []
    for x in xs:
        with cupy.cuda.Stream(non_blocking=True):
            outs.append(compiled(x))
    tc.cuda.synchronize()
    for x, out in zip(xs, outs):
        assert np.array_equal(out.numpy(), (tc.tanh(x) * 2 + 1).numpy())


def test_replays_queued_past_the_pointer_ring_each_read_their_own_inputs():
    """The graph copies its inputs in and outputs out through a ring of pointer rows: a
    host three rings ahead of the device waits for a row instead of overwriting it."""
    from tensorcore.backends.cupy.graph_io import RING

    compiled = tc.compile(lambda x, y: (tc.tanh(x) * 2 + y, x.sum()), cache_dir=False)
    xs = [tc.randn(1 << 18, device="cuda") for _ in range(3 * RING)]
    y = tc.randn(1 << 18, device="cuda")
    compiled(xs[0], y)
    outs = [compiled(x, y) for x in xs]
    tc.cuda.synchronize()
    for x, (out, total) in zip(xs, outs):
        assert np.array_equal(out.numpy(), (tc.tanh(x) * 2 + y).numpy())
        assert np.array_equal(total.numpy(), x.sum().numpy())


@pytest.mark.parametrize("shape, dtype", [((5,), tc.float32), ((3, 7), tc.bfloat16), ((1,), tc.int64)])
def test_inputs_and_outputs_of_any_byte_size(shape, dtype):
    compiled = tc.compile(lambda x: x * 3, cache_dir=False)
    for _ in range(3):
        x = (tc.randn(*shape, device="cuda") * 10).to(dtype=dtype)
        assert np.array_equal(compiled(x).numpy(), (x * 3).numpy())


def test_a_non_contiguous_input_and_kept_outputs():
    compiled = tc.compile(lambda x: x + 1, cache_dir=False)
    base = tc.randn(8, 6, device="cuda")
    compiled(base[:, ::2])
    for k in range(3):
        view = (base * k)[:, ::2]  # strided: copied in by the host, not by the graph
        assert np.array_equal(compiled(view).numpy(), (view + 1).numpy())
    kept = tc.compile(lambda x: x + 1, cache_dir=False, reuse_outputs=True)
    x = tc.randn(4, device="cuda")
    kept(x)  # traced: the eager result
    second = kept(x * 2)
    third = kept(x * 3)
    assert second.data.data.ptr == third.data.data.ptr  # the plan's own buffer, both times
    assert np.array_equal(third.numpy(), (x * 3 + 1).numpy())


def test_train_step_graph_updates_parameters_and_advances_dropout():
    tc.manual_seed(0)
    model = layers.Sequential(layers.Linear(8, 32), layers.SiLU(), layers.Dropout(0.3), layers.Linear(32, 4)).to("cuda")
    opt = optim.AdamW(model.parameters(), lr=1e-2)

    def step(x, y):
        opt.zero_grad(set_to_none=False)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    compiled = tc.compile(step, cache_dir=False)
    x, y = tc.randn(16, 8, device="cuda"), tc.randn(16, 4, device="cuda")
    losses = [float(compiled(x, y).numpy()) for _ in range(30)]
    assert compiled.cache_info().hits >= 25
    assert losses[-1] < losses[0] and len(set(losses)) == len(losses)


def test_a_generator_set_to_another_seed_is_honoured():
    """A CUDA generator's seed is a launch argument, held by the captured graph: setting a
    state of another seed must retrace, not replay the old seed."""
    gen = tc.Generator("cuda", seed=1)
    compiled = tc.compile(lambda x: x + tc.randn(*x.shape, device="cuda", generator=gen), cache_dir=False)
    x = tc.zeros(64, device="cuda")
    compiled(x), compiled(x)
    other = tc.Generator("cuda", seed=2)
    state = other.get_state()
    gen.set_state(state)
    want = tc.randn(64, device="cuda", generator=other).numpy()
    np.testing.assert_array_equal(compiled(x).numpy(), want)
    gen.set_state(state)  # the same seed again: the plan of that state replays
    np.testing.assert_array_equal(compiled(x).numpy(), want)
