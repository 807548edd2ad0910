"""Memory on the GPU path.

* Convolution weights stored channels-last (``Module.to(memory_format=tc.channels_last)``)
  are read by the implicit-GEMM forward where they lie: the same results bit for bit as
  contiguous weights, eager and compiled, and a CUDA-graph plan keeps no packed copy.
* A CUDA-graph plan frees each intermediate after the last step that touches it, so its
  pool holds its largest live set, not every intermediate at once; the capture allocates
  first fit inside one block (``pools.CaptureArena``), freed ranges merging at once.
* ``Module.to`` casting and laying weights out on the GPU leaves the pool holding nothing
  it cannot give back.
* Once captured, a plan drops the eager convolutions' scratch its trace grew (the replays
  use the plan's own pool); a stream captured into a user's graph keeps its own.
"""

from __future__ import annotations

import numpy as np
import pytest

import layers
import tensorcore as tc
import tensorcore.functional as F

pytestmark = pytest.mark.gpu
pytest.importorskip("cupy")


class _Block(layers.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.first = layers.Conv2d(channels, channels, 3, padding=1)
        self.norm = layers.GroupNorm(8, channels)
        self.second = layers.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: tc.Tensor) -> tc.Tensor:
        return x + self.second(F.silu(self.norm(self.first(x))))


def _executor(compiled):
    (entry,) = compiled._plans.values()
    return entry.executor


@pytest.mark.parametrize("dtype", [tc.float16, tc.bfloat16])
def test_channels_last_weights_convolve_like_contiguous_ones_with_no_packed_copy(dtype) -> None:
    tc.manual_seed(0)
    plain = _Block(64).to("cuda", dtype).eval()
    laid = _Block(64).to("cuda", dtype).eval()
    laid.load_state_dict(plain.state_dict())
    laid.to(memory_format=tc.channels_last)
    x = tc.tensor(np.random.default_rng(1).standard_normal((2, 64, 24, 20)), device="cuda").to(dtype)
    with tc.no_grad():
        np.testing.assert_array_equal(laid(x).float().numpy(), plain(x).float().numpy())
        compiled, compiled_plain = tc.compile(laid, cache_dir=False), tc.compile(plain, cache_dir=False)
        compiled(x), compiled_plain(x)  # traced: the next calls replay the plans
        np.testing.assert_array_equal(compiled(x).float().numpy(), compiled_plain(x).float().numpy())
    assert len(_executor(compiled).weight_packs) == 0 < len(_executor(compiled_plain).weight_packs)


def test_a_plan_drops_the_eager_scratch_its_trace_grew() -> None:
    from tensorcore.backends.cupy import conv_igemm

    tc.manual_seed(0)
    block = _Block(64).to("cuda", tc.float16).eval()
    x = tc.tensor(np.random.default_rng(1).standard_normal((2, 64, 24, 20)), device="cuda").to(tc.float16)
    conv_igemm.clear_scratch()
    with tc.no_grad():
        want = block(x).float().numpy()
        assert conv_igemm._scratch  # the eager convolutions keep a buffer per stream
        compiled = tc.compile(block, cache_dir=False)
        got = compiled(x).float().numpy()  # traced, then captured
        assert not conv_igemm._scratch
        # the plan folds the residual add into its convolution: one rounding fewer
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
        np.testing.assert_array_equal(compiled(x).float().numpy(), got)  # replayed
        np.testing.assert_array_equal(block(x).float().numpy(), want)  # eager again: grown again
        assert conv_igemm._scratch


def test_a_plan_holds_its_largest_live_set_not_every_intermediate() -> None:
    tc.manual_seed(0)
    depth, rows, width = 12, 2048, 1024
    model = layers.Sequential(*[layers.Sequential(layers.Linear(width, width, bias=False), layers.ReLU())
                                for _ in range(depth)]).to("cuda").eval()
    x = tc.tensor(np.random.default_rng(0).standard_normal((rows, width)).astype(np.float32), device="cuda")
    with tc.no_grad():
        compiled = tc.compile(model)
        got = compiled(x).numpy()
        np.testing.assert_array_equal(got, model(x).numpy())
        np.testing.assert_array_equal(compiled(x * 2).numpy(), model(x * 2).numpy())
    intermediate = rows * width * 4
    held = _executor(compiled).pool.total_bytes()  # its peak: freed blocks stay in the pool
    assert held <= 5 * intermediate, f"the plan holds {held} bytes for {depth} intermediates of {intermediate}"


def test_the_capture_arena_reuses_and_merges_freed_ranges_and_sends_the_rest_to_the_pool() -> None:
    import cupy

    from tensorcore.backends.cupy.pools import CaptureArena

    pool = cupy.cuda.MemoryPool()
    arena = CaptureArena(pool, 4096, 256)
    first, second, third = arena.malloc(1000), arena.malloc(256), arena.malloc(512)
    assert [p.ptr - arena.block.ptr for p in (first, second, third)] == [0, 1024, 1280]
    del second
    kept = arena.malloc(100)
    assert kept.ptr - arena.block.ptr == 1024  # the lowest range that fits
    del first
    assert arena.free[0] == [0, 1024]
    del third
    assert arena.free == [[0, 1024], [1280, 4096 - 1280]]  # the 100-byte block still holds 1024..1280
    outside = arena.malloc(8192)
    assert not arena.block.ptr <= outside.ptr < arena.block.ptr + 4096 and pool.used_bytes() >= 4096 + 8192


def test_weights_cast_and_laid_out_on_the_gpu_leave_no_free_memory_held() -> None:
    """Each copy ``Module.to`` makes on the GPU gets a block of its own, none carved out of
    a larger block an earlier copy freed (whose rest the pool could never give back)."""
    import cupy

    tc.manual_seed(0)
    model = layers.Sequential(*[layers.Conv2d(c, c, 3, padding=1) for c in (512, 384, 256, 192, 128)]).to("cuda")
    pool = cupy.get_default_memory_pool()

    def held_free() -> int:
        pool.free_all_blocks()
        return pool.total_bytes() - pool.used_bytes()

    before = held_free()
    model.to(tc.float16, memory_format=tc.channels_last)
    assert all(p.dtype == tc.float16 for p in model.parameters())
    assert model[0].weight.data.strides[1] == 2  # channels-last: the channel is the fastest axis
    assert held_free() - before < 512 * 1024
