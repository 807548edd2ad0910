"""CPU thread coordination for the Numba backend: one pool of worker threads.

A CPU train step alternates Numba kernels and BLAS matrix products every few tens of
microseconds.  Numba and the BLAS each bring a thread pool, and each pool's workers
busy-wait after their work (OpenMP for ~300 000 spins, OpenBLAS for 2^28 cycles by
default), so on a few cores the two pools take turns stealing each other's cores: a
parallel region whose second thread is descheduled behind a spinning one waits a whole
scheduler slice.  Environment variables that shorten the waits are read only when a
library loads, so they do nothing once NumPy (or torch) is imported.  Hence, at run
time, once per process (``configure``, called when the Numba backend is created):

1. Numba's parallel loops run on OpenMP (the ``omp`` threading layer) unless
   ``NUMBA_THREADING_LAYER`` names another.  If Numba is the first to load GNU
   OpenMP, its workers spin ``GOMP_SPINCOUNT`` = 30 000 times after a region (unless
   the variable is set): long enough to catch the next kernel of a step across the
   Python work between kernels, a tenth of libgomp's default so an idle worker soon
   yields a core another process needs.  The variable is set only while Numba
   loads the runtime, then removed.  Torch shares the process's one GNU OpenMP
   runtime with Numba, whichever loads it first (and then its spin setting).
2. OpenBLAS (NumPy's BLAS) runs its parallel jobs on that same pool: its threads
   callback hands each multi-threaded product's jobs to ``_run_blas_jobs``, a
   parallel loop with one job per thread, so its own workers never run.
3. A BLAS without that hook (MKL, BLIS, OpenBLAS < 0.3.27, or a non-OpenMP Numba
   layer) is limited to one thread while Numba runs more, through threadpoolctl:
   one pool is multi-threaded, never two.

``set_num_threads(n)`` then sets the thread count of both, process-wide.  Every parallel
kernel goes through ``SizedKernel``, which runs it on one thread when its arrays hold
fewer than ``SERIAL_BELOW`` elements in all: waking a second thread and joining it
costs more than it saves on small work (and on a busy machine much more).
"""

from __future__ import annotations

import ctypes
import functools
import operator
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .. import report

SPIN_COUNT = "30000"  # GOMP_SPINCOUNT for Numba's OpenMP workers (see 1. above)
SERIAL_BELOW = 65_536  # elements over a kernel's array arguments (see SizedKernel)
_CALLBACK_SYMBOL = "openblas_set_threads_callback_function"


@dataclass
class _Pools:
    """What ``configure`` found and chose."""

    layer: str                    # Numba's threading layer ("omp", "tbb", "workqueue", "" without Numba)
    pool_size: int                # threads Numba launched (the most it can run)
    blas: list[Any] = field(default_factory=list)   # threadpoolctl controllers of the BLAS libraries
    blas_on_numba_pool: bool = False  # OpenBLAS hands its jobs to Numba's pool
    num_threads: int = 1


_lock = threading.Lock()
_pools: _Pools | None = None
_hooked: list[tuple[Any, Any]] = []  # (setter, callback) pairs installed, kept alive for OpenBLAS


def configure() -> None:
    """Set up the thread pools once per process (idempotent, thread-safe)."""
    global _pools
    if _pools is not None:
        return
    with _lock:
        if _pools is not None:
            return
        try:
            layer, pool_size = _launch_numba()
        except ImportError:
            layer, pool_size = "", 1
        pools = _Pools(layer, pool_size, _blas_controllers())
        # a BLAS limited by OPENBLAS_NUM_THREADS / OMP_NUM_THREADS at load keeps that limit
        blas_limit = min([c.num_threads for c in pools.blas], default=pool_size)
        if layer == "omp":
            pools.blas_on_numba_pool = _hook_openblas(pools.blas)
        _pools = pools
        _apply(pools, pool_size, blas_limit)


def configured() -> bool:
    """Whether ``configure`` has set up the pools in this process."""
    return _pools is not None


def set_num_threads(n: int) -> None:
    """Use ``n`` threads for the Numba kernels and the BLAS matrix products, as
    ``torch.set_num_threads``.  More threads than Numba's pool holds (the cores, or
    ``NUMBA_NUM_THREADS``) run as many as the pool holds."""
    if isinstance(n, bool) or not hasattr(type(n), "__index__"):  # ints and NumPy integers
        raise TypeError(f"set_num_threads: n must be an int, got {type(n).__name__} {n!r}")
    n = operator.index(n)
    if n < 1:
        raise ValueError(f"set_num_threads: n must be >= 1, got {n}")
    configure()
    with _lock:
        _apply(_pools, n)


def get_num_threads() -> int:
    """The number of threads the Numba kernels and BLAS products use."""
    configure()
    return _pools.num_threads


class SizedKernel:
    """A parallel Numba kernel that runs on one thread when its array arguments hold
    fewer than ``SERIAL_BELOW`` elements in all, else on ``get_num_threads()``."""

    def __init__(self, dispatcher: Any) -> None:
        self.dispatcher = dispatcher
        functools.update_wrapper(self, dispatcher.py_func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _pools is None:
            configure()
        _use_threads(1 if _work((*args, *kwargs.values()) if kwargs else args) < SERIAL_BELOW
                     else _pools.num_threads)
        if report.active:
            report.note_kernel(self.label())
        return self.dispatcher(*args, **kwargs)

    def bind(self, *args: Any) -> Callable[[], Any]:
        """The kernel bound to ``args``, sized once: a compiled plan's replay calls it
        with no per-call size count."""
        configure()
        serial, dispatcher = runs_serially(args), self.dispatcher

        def call() -> Any:
            _use_threads(1 if serial else _pools.num_threads)
            if report.active:
                report.note_kernel(self.label())
            return dispatcher(*args)
        return call

    def label(self) -> str:
        """The kernel's name with its module's, as ``DEBUG=2`` prints it: ``softmax.softmax_rows``."""
        return f"{self.__module__.rpartition('.')[2]}.{self.__name__}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dispatcher, name)


def runs_serially(args: tuple) -> bool:
    """Whether a ``SizedKernel`` called with ``args`` runs on one thread (compiled plans
    that call the kernel from jitted code decide once, by the same rule)."""
    return _work(args) < SERIAL_BELOW


def forget_thread_count() -> None:
    """Jitted code set Numba's thread count of the calling thread itself (a native plan
    stopped part-way): the next kernel call sets it again."""
    _calling_thread.threads = None


def _work(args: tuple) -> int:
    work = 0
    for a in args:  # a plain loop: this runs on every kernel call
        if isinstance(a, np.ndarray):
            work += a.size
    return work


_calling_thread = threading.local()  # .threads: the Numba thread count this thread last set


def _use_threads(n: int) -> None:
    """Set Numba's thread count for the calling thread (Numba keeps one per thread)."""
    if getattr(_calling_thread, "threads", None) != n:
        from numba.np.ufunc import parallel

        parallel._set_num_threads(n)  # numba.set_num_threads without its ~10 us of checks
        _calling_thread.threads = n


def thread_info() -> dict[str, Any]:
    """How the pools are set up: Numba's layer and pool size, the BLAS libraries and
    whether their jobs run on Numba's pool (for benchmarks and bug reports)."""
    configure()
    return {"numba_layer": _pools.layer or None, "numba_pool_size": _pools.pool_size,
            "num_threads": get_num_threads(), "blas_on_numba_pool": _pools.blas_on_numba_pool,
            "blas": [c.info() for c in _pools.blas]}


def _apply(pools: _Pools, n: int, blas_limit: int | None = None) -> None:
    """Give Numba ``min(n, pool size)`` threads, and BLAS as many when its jobs run on
    Numba's pool, else one thread while Numba runs several (``n`` without Numba)."""
    numba_n = min(n, pools.pool_size)
    if pools.layer:
        _use_threads(numba_n)
    if pools.blas_on_numba_pool:
        blas_n = numba_n
    else:
        blas_n = 1 if pools.layer and numba_n > 1 else n
    if blas_limit is not None:
        blas_n = min(blas_n, blas_limit)
    for controller in pools.blas:
        controller.set_num_threads(blas_n)
    pools.num_threads = numba_n if pools.layer else blas_n


def _launch_numba() -> tuple[str, int]:
    """Start Numba's pool on OpenMP (unless the user chose a layer); returns (layer, size)."""
    import numba
    from numba.np.ufunc import parallel

    if parallel._is_initialized:  # someone ran a parallel Numba function before us
        return numba.threading_layer(), numba.config.NUMBA_NUM_THREADS
    spin_unset = "GOMP_SPINCOUNT" not in os.environ
    if spin_unset:
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT  # read by libgomp as Numba loads it, below
    ours = numba.config.THREADING_LAYER == "default"  # else the user named one
    if ours:
        numba.config.THREADING_LAYER = "omp"
    try:
        parallel._launch_threads()
    except (ValueError, ImportError, OSError):
        if not ours:
            raise
        numba.config.THREADING_LAYER = "default"  # no OpenMP runtime: Numba's own order
        parallel._launch_threads()
    finally:
        if spin_unset:
            del os.environ["GOMP_SPINCOUNT"]
    return numba.threading_layer(), numba.config.NUMBA_NUM_THREADS


def _blas_controllers() -> list[Any]:
    """threadpoolctl's controllers for the BLAS libraries loaded in this process."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # a declared dependency; an environment without it still runs
        warnings.warn("threadpoolctl is not installed, so tensorcore cannot size NumPy's BLAS "
                      "threads: pip install threadpoolctl", RuntimeWarning, stacklevel=3)
        return []
    return list(ThreadpoolController().select(user_api="blas").lib_controllers)


def _hook_openblas(controllers: list[Any]) -> bool:
    """Hand the parallel jobs of every loaded OpenBLAS to Numba's pool; False (and
    nothing changed) if one of the BLAS libraries lacks the hook."""
    if not controllers:
        return False
    setters = []
    for controller in controllers:
        setter = _callback_setter(controller)
        if setter is None:
            return False
        setters.append(setter)
    runner = _compile_blas_runner()
    for setter in setters:
        setter(ctypes.c_void_p(runner.address))
        _hooked.append((setter, runner))
    os.register_at_fork(after_in_child=_unhook_in_child)
    return True


def _callback_setter(controller: Any) -> Any | None:
    """OpenBLAS's callback setter in ``controller``'s library, or None (not OpenBLAS, or
    older than 0.3.27).  Builds for SciPy/NumPy prefix and suffix the exported names."""
    if controller.internal_api != "openblas":
        return None
    for prefix in ("", "scipy_"):
        for suffix in ("", "64_", "_64"):
            setter = getattr(controller.dynlib, f"{prefix}{_CALLBACK_SYMBOL}{suffix}", None)
            if setter is not None:
                setter.argtypes, setter.restype = [ctypes.c_void_p], None
                return setter
    return None


def _unhook_in_child() -> None:
    """After fork: GNU OpenMP does not survive a fork, so OpenBLAS uses its own threads."""
    for setter, _ in _hooked:
        setter(None)
    _hooked.clear()
    if _pools is not None:
        _pools.blas_on_numba_pool = False


# ----- OpenBLAS jobs on Numba's pool ---------------------------------------------------
# OpenBLAS calls the runner as callback(sync, dojob, numjobs, jobdata_elsize, jobdata,
# dojob_data) and expects dojob(i, jobdata + i * elsize, dojob_data) for every job i,
# all at once: the jobs of one product wait on each other, so each needs its own thread.
# The runner's names are bound by _compile_blas_runner, which imports Numba; the
# functions are module-level so Numba's disk cache finds them again in the next process.
# With the team sized to numjobs, parallel_for runs one job per thread.
_call_job = _team_size = _swap_busy = _parallel_for = _one_job = None


def _run_blas_job(i, dojob, elsize, jobdata, dojob_data):  # pragma: no cover (compiled)
    _call_job(dojob, i, jobdata + i * elsize, dojob_data)


def _run_blas_jobs(sync, dojob, numjobs, elsize, jobdata, dojob_data):  # pragma: no cover (compiled)
    while _swap_busy(1) != 0:  # one product at a time: jobs > 0 share OpenBLAS's buffers
        pass
    saved = _team_size(numjobs)
    _parallel_for(_one_job, numjobs, (dojob, elsize, jobdata, dojob_data))
    _team_size(saved)
    _swap_busy(0)


def _compile_blas_runner() -> Any:
    """``_run_blas_jobs`` as a C callback (loaded from Numba's cache after the first run)."""
    global _call_job, _team_size, _swap_busy, _parallel_for, _one_job
    from llvmlite import ir
    from numba import cfunc, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from .kernels.jit import helper
    from .kernels.parallel import parallel_for

    i32, i64, byte_ptr = ir.IntType(32), ir.IntType(64), ir.IntType(8).as_pointer()

    @intrinsic
    def call_job(typingctx, fn, i, data, extra):
        """Call the C function at address ``fn`` as fn(int i, void *data, int extra)."""
        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.VoidType(), [i32, byte_ptr, i32])
            target = builder.inttoptr(args[0], fnty.as_pointer())
            builder.call(target, [builder.trunc(args[1], i32), builder.inttoptr(args[2], byte_ptr), args[3]])
            return context.get_dummy_value()
        return types.void(types.uintp, types.intp, types.uintp, types.int32), codegen

    @intrinsic
    def team_size(typingctx, n):
        """Set the calling thread's Numba thread count to ``n``; return the previous one.
        (Calls the layer's C entry points, as Numba's own parallel code does.)"""
        def codegen(context, builder, signature, args):
            mod = builder.module
            get = cgutils.get_or_insert_function(mod, ir.FunctionType(i64, []), "get_num_threads")
            put = cgutils.get_or_insert_function(mod, ir.FunctionType(ir.VoidType(), [i32]), "set_num_threads")
            previous = builder.trunc(builder.call(get, []), i32)
            builder.call(put, [args[0]])
            return previous
        return types.int32(types.int32), codegen

    @intrinsic
    def swap_busy(typingctx, value):
        """Atomically store ``value`` in a process-wide flag; return the old value."""
        def codegen(context, builder, signature, args):
            mod = builder.module
            flag = mod.globals.get("tensorcore_blas_busy")
            if flag is None:
                flag = cgutils.add_global_variable(mod, i32, "tensorcore_blas_busy")
                flag.linkage, flag.initializer = "internal", ir.Constant(i32, 0)
            return builder.atomic_rmw("xchg", flag, args[0], "seq_cst")
        return types.int32(types.int32), codegen

    _call_job, _team_size, _swap_busy = call_job, team_size, swap_busy
    _parallel_for, _one_job = parallel_for, helper(_run_blas_job)
    signature = types.void(types.int32, types.uintp, types.int32, types.uintp, types.uintp, types.int32)
    return cfunc(signature, cache=True)(_run_blas_jobs)
