"""``kernels.parallel.parallel_for``: every index once, on the calling thread's thread
count, with literal arguments kept, and a kernel using it loads from the disk cache in
a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, strategies as st

pytest.importorskip("numba")

from numba import njit, types  # noqa: E402
from numba.np.ufunc import parallel as numba_parallel  # noqa: E402

from tensorcore.backends.numba import threads  # noqa: E402
from tensorcore.backends.numba.kernels.activations import ACT_CODES, act_value  # noqa: E402
from tensorcore.backends.numba.kernels.jit import helper  # noqa: E402
from tensorcore.backends.numba.kernels.parallel import MAX_CHUNKS, parallel_for  # noqa: E402


@helper
def _count_visit(i, visits, thread_of):
    visits[i] += 1
    thread_of[i] = numba_parallel._get_thread_id()


@njit
def _visit_all(n):
    visits = np.zeros(n, np.int64)
    thread_of = np.full(n, -1, np.int64)
    parallel_for(_count_visit, n, (visits, thread_of))
    return visits, thread_of


@pytest.mark.parametrize("threads_used", [1, 2])
@given(n=st.one_of(st.integers(0, 20), st.sampled_from([MAX_CHUNKS - 1, MAX_CHUNKS, MAX_CHUNKS + 1, 4099])))
def test_every_index_is_visited_once(threads_used, n):
    threads.configure()
    threads.set_num_threads(min(threads_used, threads.thread_info()["numba_pool_size"]))
    try:
        visits, thread_of = _visit_all(n)
    finally:
        threads.set_num_threads(threads.thread_info()["numba_pool_size"])
    assert np.array_equal(visits, np.ones(n, np.int64))
    # contiguous chunks: the thread ids never go back to an earlier thread
    if n:
        changes = np.flatnonzero(np.diff(thread_of))
        assert len(np.unique(thread_of)) == len(changes) + 1


def test_one_thread_runs_in_place():
    threads.configure()
    threads.set_num_threads(1)
    try:
        _, thread_of = _visit_all(64)
    finally:
        threads.set_num_threads(threads.thread_info()["numba_pool_size"])
    assert set(thread_of.tolist()) == {0}


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")
def test_two_threads_split_the_range():
    threads.configure()
    threads.set_num_threads(2)
    _, thread_of = _visit_all(1000)
    assert len(set(thread_of.tolist())) == 2


@helper
def _activate(i, x, out, code):
    out[i] = act_value(code, x[i])  # a typing error unless ``code`` is a compile-time constant


@njit
def _activate_all(x, code):
    out = np.empty_like(x)
    parallel_for(_activate, x.size, (x, out, code))
    return out


def test_a_literal_argument_reaches_the_body_as_a_literal():
    x = np.linspace(-2, 2, 9)
    assert np.array_equal(_activate_all(x, ACT_CODES["relu"]), np.maximum(x, 0))
    assert np.array_equal(_activate_all(x, ACT_CODES["none"]), x)
    body_codes = {sig[-1] for sig in _activate.signatures}
    assert body_codes == {types.literal(int(ACT_CODES["relu"])), types.literal(int(ACT_CODES["none"]))}


def test_a_body_that_is_not_jitted_is_refused():
    @njit
    def bad(out):
        parallel_for(np.negative, out.size, (out,))

    with pytest.raises(Exception, match="parallel_for: body must be a jitted function"):
        bad(np.zeros(3))


def test_a_cached_kernel_loads_and_runs_in_a_fresh_process(tmp_path):
    module = tmp_path / "cached_parallel_kernel.py"
    module.write_text(textwrap.dedent("""
        import numpy as np
        from numba import njit
        from tensorcore.backends.numba.kernels.parallel import parallel_for

        @njit(cache=True)
        def _square(i, x, out):
            out[i] = x[i] * x[i]

        @njit(cache=True)
        def squares(x):
            out = np.empty_like(x)
            parallel_for(_square, x.size, (x, out))
            return out

        if __name__ == "__main__":
            x = np.arange(100_000, dtype=np.float64)
            assert np.array_equal(squares(x), x * x)
            print(len(squares.stats.cache_hits), len(squares.stats.cache_misses))
    """))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": os.pathsep.join(sys.path)}
    runs = [subprocess.run([sys.executable, str(module)], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert runs[0].stdout.split() == ["0", "1"]  # compiled
    assert runs[1].stdout.split() == ["1", "0"]  # loaded from the cache, and ran


@helper
def _allocate(i, sizes, out):
    out[i] = np.empty(sizes[i], np.float64).size


@njit
def _allocate_all(sizes):
    out = np.zeros(sizes.size, np.int64)
    parallel_for(_allocate, sizes.size, (sizes, out))
    return out


@pytest.mark.parametrize("threads_used", [1, 2])
def test_a_failing_task_raises_instead_of_leaving_garbage(threads_used):
    threads.configure()
    threads.set_num_threads(min(threads_used, threads.thread_info()["numba_pool_size"]))
    try:
        assert _allocate_all(np.array([3, 5, 7])).tolist() == [3, 5, 7]
        with pytest.raises(RuntimeError, match="parallel_for: _allocate raised in a parallel task"):
            _allocate_all(np.array([3, -1, 7]))  # a negative size: np.empty raises
    finally:
        threads.set_num_threads(threads.thread_info()["numba_pool_size"])


def test_compiling_a_kernel_keeps_none_of_its_first_call_arrays():
    import gc
    import weakref

    @helper
    def activate(i, x, out, code):
        out[i] = act_value(code, x[i])

    @njit
    def kernel(x, code):
        out = np.empty_like(x)
        parallel_for(activate, x.size, (x, out, code))
        return out

    x = np.linspace(-1, 1, 7)
    out = kernel(x, ACT_CODES["silu"])  # compiles here
    held = weakref.ref(x), weakref.ref(out)
    del x, out
    gc.collect()
    assert [ref() for ref in held] == [None, None]
