"""Collectives over NCCL (CuPy's ``cupy.cuda.nccl``) between GPUs, one GPU per process.

Each collective is enqueued on the current CUDA stream, so it is ordered after the
kernels that produced its input and before those that read its output, and inside a
stream capture it becomes a node of the CUDA graph.  ``overlap=True`` runs it on the
communicator's side stream instead, forked from the current stream (an event) so it
starts once its input is ready while the current stream goes on; ``"wait"`` joins the
side stream back.  Fork and join are events, so they are captured too.

NCCL waits for a dead peer on the device: nothing here can time that out.  The
launcher (``python -m tensorcore.distributed.run``) stops the other ranks when one dies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import bfloat16_dtype


def load_nccl() -> Any:
    """``cupy.cuda.nccl`` (RuntimeError naming what is missing: CuPy, a GPU or NCCL)."""
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as exc:
        raise RuntimeError(f"init('nccl'): CuPy with NCCL is needed ({exc}); pip install tensorcore-engine[cuda12] "
                           "(or [cuda13]) and NCCL (pip install nvidia-nccl-cu12)") from None
    if not getattr(nccl, "available", False):
        raise RuntimeError("init('nccl'): CuPy found no NCCL library; install NCCL (pip install nvidia-nccl-cu12 "
                           "or nvidia-nccl-cu13, matching CuPy's CUDA)")
    if cupy.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("init('nccl'): no CUDA device is visible")
    return nccl


def unique_id() -> bytes:
    """A fresh NCCL unique id (rank 0 makes it, every rank needs it) as bytes."""
    uid = load_nccl().get_unique_id()
    return uid if isinstance(uid, bytes) else bytes(b & 0xFF for b in uid)  # older CuPy: signed chars


class NcclCommunicator:
    """An NCCL communicator over ``world_size`` processes, this one being ``rank``."""

    backend = "nccl"
    device = "cuda"

    def __init__(self, rank: int, world_size: int, uid: bytes) -> None:
        import cupy

        self.nccl = nccl = load_nccl()
        self.cupy = cupy
        self.rank, self.world_size = rank, world_size
        try:
            self.comm = nccl.NcclCommunicator(world_size, uid, rank)  # CuPy 14 takes the id as bytes
        except TypeError:  # older CuPy: a tuple of signed chars
            self.comm = nccl.NcclCommunicator(world_size, tuple(b - 256 if b > 127 else b for b in uid), rank)
        self.side = cupy.cuda.Stream(non_blocking=True)
        self.forked = cupy.cuda.Event(disable_timing=True)
        self.joined = cupy.cuda.Event(disable_timing=True)
        self.overlapping = False  # the side stream holds work not joined yet
        self.token = cupy.zeros(1, np.float32)  # what a barrier reduces
        self.types = {np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.float32): nccl.NCCL_FLOAT32,
                      np.dtype(np.float64): nccl.NCCL_FLOAT64, np.dtype(np.int32): nccl.NCCL_INT32,
                      np.dtype(np.int64): nccl.NCCL_INT64, np.dtype(np.uint8): nccl.NCCL_UINT8,
                      bfloat16_dtype(): nccl.NCCL_BFLOAT16}
        self.reductions = {"sum": nccl.NCCL_SUM, "avg": nccl.NCCL_AVG, "max": nccl.NCCL_MAX}

    def run(self, op: str, dst: Any, src: Any, reduce: str = "sum", root: int = 0, overlap: bool = False) -> None:
        """Enqueue collective ``op`` (or join the side stream: ``"wait"``)."""
        current = self.cupy.cuda.get_current_stream()
        if op == "wait":
            if self.overlapping:
                self.joined.record(self.side)
                current.wait_event(self.joined)
                self.overlapping = False
            return
        stream = current
        if overlap:
            self.forked.record(current)
            self.side.wait_event(self.forked)
            stream, self.overlapping = self.side, True
        src = dst if src is None else src
        comm, ptr = self.comm, stream.ptr
        if op == "all_reduce":
            comm.allReduce(src.data.ptr, dst.data.ptr, dst.size, self._type(op, dst), self.reductions[reduce], ptr)
        elif op == "reduce_scatter":
            comm.reduceScatter(src.data.ptr, dst.data.ptr, dst.size, self._type(op, dst), self.reductions[reduce], ptr)
        elif op == "broadcast":
            comm.broadcast(src.data.ptr, dst.data.ptr, dst.nbytes, self.nccl.NCCL_UINT8, root, ptr)
        elif op == "all_gather":
            comm.allGather(src.data.ptr, dst.data.ptr, src.nbytes, self.nccl.NCCL_UINT8, ptr)
        elif op == "barrier":
            comm.allReduce(self.token.data.ptr, self.token.data.ptr, 1, self.nccl.NCCL_FLOAT32, self.nccl.NCCL_SUM, ptr)
            if not stream.is_capturing():
                stream.synchronize()
        else:
            raise ValueError(f"nccl: unknown collective {op!r}")

    def _type(self, op: str, a: Any) -> int:
        found = self.types.get(np.dtype(a.dtype))
        if found is None:
            raise TypeError(f"{op}: NCCL cannot reduce {a.dtype} arrays")
        return found

    def close(self) -> None:
        """Wait for the side stream and free the NCCL communicator."""
        if self.comm is not None:
            self.side.synchronize()
            self.comm.destroy()
            self.comm = None
