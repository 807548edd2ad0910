"""Collectives over MPI (``mpi4py``) between CPU processes.

Every collective is MPI's non-blocking form (``Iallreduce``, ``Ibcast``, ...) completed
by polling against a deadline: a peer that died or stopped calling collectives makes
``run`` raise a RuntimeError after ``timeout`` seconds instead of blocking for ever.
``overlap=True`` leaves the request pending until ``"wait"``, so the gradient buckets
of a backward pass travel while the rest of backward computes.

MPI has no average, so ``avg`` sums and divides; bfloat16 (which MPI cannot type) is
reduced in float32.  MPI is finalized at exit only while no collective is left
half-done: finalizing with a dead peer's request pending would hang.
"""

from __future__ import annotations

import atexit
import time
from typing import Any, Callable

import numpy as np

from ..dtypes import is_bfloat16

Finish = Callable[[], None] | None  # host work once a request completes (divide for avg, copy back)


class _Runtime:
    """MPI in this process: whether a collective was left half-done (then MPI is never
    finalized), and whether finalizing at exit is arranged."""

    failed: str | None = None
    finalizes = False


_runtime = _Runtime()


def load_mpi() -> Any:
    """``mpi4py.MPI``, imported with finalization left to this module (RuntimeError if
    mpi4py or the MPI library it needs is missing)."""
    try:
        import mpi4py

        mpi4py.rc.finalize = False
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError) as exc:
        raise RuntimeError(f"tensorcore.distributed: MPI cannot start ({exc}); install mpi4py and an MPI runtime: "
                           "pip install tensorcore-engine[distributed] mpich") from None
    if not _runtime.finalizes:
        atexit.register(_finalize, MPI)
        _runtime.finalizes = True
    return MPI


def _finalize(MPI: Any) -> None:  # noqa: N803  (mpi4py's module name)
    if _runtime.failed is None and not MPI.Is_finalized():
        MPI.Finalize()


class MpiCommunicator:
    """The processes of MPI's world, on the CPU."""

    backend = "mpi"
    device = "cpu"

    def __init__(self, timeout: float) -> None:
        self.MPI = load_mpi()
        self.comm = self.MPI.COMM_WORLD
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        self.timeout = timeout
        self.pending: list[tuple[str, Any, Finish]] = []
        self.ops = {"all_reduce": self._all_reduce, "broadcast": self._broadcast, "all_gather": self._all_gather,
                    "reduce_scatter": self._reduce_scatter, "barrier": self._barrier}
        self.reductions = {"sum": self.MPI.SUM, "avg": self.MPI.SUM, "max": self.MPI.MAX}

    def run(self, op: str, dst: Any, src: Any, reduce: str = "sum", root: int = 0, overlap: bool = False) -> None:
        """Start collective ``op`` (or complete the pending ones: ``"wait"``)."""
        if op != "wait":
            if _runtime.failed is not None:
                raise RuntimeError(f"{op}: MPI is unusable in this process after an earlier failure "
                                   f"({_runtime.failed})")
            request, finish = self._start(op, dst, src, reduce, root)
            self.pending.append((op, request, finish))
            if overlap:
                return
        self.wait()

    def wait(self) -> None:
        """Complete every pending collective before the deadline."""
        deadline = time.monotonic() + self.timeout
        pending, self.pending = self.pending, []
        for op, request, finish in pending:
            self._complete(op, request, deadline)
            if finish is not None:
                finish()

    # ----- the collectives: each starts a request, in place on dst ---------------------
    def _start(self, op: str, dst: Any, src: Any, reduce: str, root: int) -> tuple[Any, Finish]:
        try:
            return self.ops[op](dst, src, reduce, root)
        except self.MPI.Exception as exc:
            _runtime.failed = f"{op} failed: {exc}"
            raise RuntimeError(f"{op}: MPI refused it on rank {self.rank}: {exc}") from None

    def _all_reduce(self, dst: Any, src: Any, reduce: str, root: int) -> tuple[Any, Finish]:
        if src is not None and src is not dst:
            np.copyto(dst, src)
        work = dst.astype(np.float32) if is_bfloat16(dst.dtype) else dst
        request = self.comm.Iallreduce(self.MPI.IN_PLACE, work, op=self.reductions[reduce])
        return request, self._finisher(dst, work, reduce)

    def _reduce_scatter(self, dst: Any, src: Any, reduce: str, root: int) -> tuple[Any, Finish]:
        send, work = src, dst
        if is_bfloat16(dst.dtype):
            send, work = src.astype(np.float32), np.empty(dst.shape, np.float32)
        request = self.comm.Ireduce_scatter_block(send, work, op=self.reductions[reduce])
        return request, self._finisher(dst, work, reduce)

    def _finisher(self, dst: Any, work: Any, reduce: str) -> Finish:
        """What turns the reduced ``work`` into ``dst``: a division for avg, a cast back."""
        if reduce == "avg":
            return lambda: np.divide(work, self.world_size, out=dst, casting="unsafe")
        if work is not dst:
            return lambda: np.copyto(dst, work, casting="unsafe")
        return None

    def _broadcast(self, dst: Any, src: Any, reduce: str, root: int) -> tuple[Any, Finish]:
        if self.rank == root and src is not None and src is not dst:
            np.copyto(dst, src)
        return self.comm.Ibcast(_bytes(dst), root=root), None

    def _all_gather(self, dst: Any, src: Any, reduce: str, root: int) -> tuple[Any, Finish]:
        chunk = dst.nbytes // self.world_size
        in_place = src.__array_interface__["data"][0] == dst.__array_interface__["data"][0] + self.rank * chunk
        send = self.MPI.IN_PLACE if in_place else _bytes(src)
        return self.comm.Iallgather(send, _bytes(dst)), None

    def _barrier(self, dst: Any, src: Any, reduce: str, root: int) -> tuple[Any, Finish]:
        return self.comm.Ibarrier(), None

    def _complete(self, op: str, request: Any, deadline: float) -> None:
        """Poll ``request`` until it completes; past ``deadline`` the communicator is
        marked failed and a RuntimeError says so."""
        polls = 0
        try:
            while not request.Test():
                polls += 1
                if polls > 1000:  # spin first (small messages finish in microseconds), then nap
                    if time.monotonic() > deadline:
                        _runtime.failed = f"{op} timed out"
                        raise RuntimeError(
                            f"{op}: rank {self.rank} of {self.world_size} had no answer from the other ranks "
                            f"within {self.timeout:g} s (the timeout given to init()); a rank has died or "
                            "stopped calling collectives")
                    time.sleep(5e-5)
        except self.MPI.Exception as exc:
            _runtime.failed = f"{op} failed: {exc}"
            raise RuntimeError(f"{op}: MPI failed on rank {self.rank}: {exc}") from None


def _bytes(a: Any) -> Any:
    """A C-contiguous array's memory as a flat uint8 array (what MPI moves without typing it)."""
    return a.reshape(-1).view(np.uint8)
