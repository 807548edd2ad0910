"""The process group: ``init`` joins this process to the job, ``destroy`` leaves it.

``init(backend)`` reads where the process sits (``environment.py``), then builds the
communicator every collective of this package goes through:

* ``"mpi"``: MPI's world, which must be the job's (the processes were started by
  ``mpiexec``; a WORLD_SIZE that disagrees is refused);
* ``"nccl"``: one GPU per process (device ``LOCAL_RANK``) and an NCCL communicator whose
  unique id rank 0 makes and shares through MPI (under ``mpiexec``) or the TCP store
  on ``MASTER_ADDR:MASTER_PORT`` (under the launcher's variables).

Every step that waits for the other ranks has the deadline ``timeout`` (seconds).
"""

from __future__ import annotations

from typing import Any

from . import environment, store

BACKENDS = ("nccl", "mpi")
DEFAULT_TIMEOUT = 300.0


class _Group:
    """The communicator of this process (None until ``init``)."""

    communicator: Any = None


_group = _Group()


def init(backend: str = "nccl", timeout: float = DEFAULT_TIMEOUT) -> None:
    """Join this process to the job: ``backend`` "nccl" (GPUs) or "mpi" (CPU processes).

    Rank and world size come from ``mpiexec`` or from ``RANK`` / ``WORLD_SIZE`` /
    ``LOCAL_RANK`` / ``MASTER_ADDR`` / ``MASTER_PORT``; a lone process is rank 0 of 1.
    Call it before creating tensors on the GPU: it selects this rank's device."""
    if backend not in BACKENDS:
        raise ValueError(f"init: backend must be one of {BACKENDS}, got {backend!r}")
    if not timeout > 0:
        raise ValueError(f"init: timeout must be a positive number of seconds, got {timeout!r}")
    if _group.communicator is not None:
        raise RuntimeError(f"init: already initialized ({_group.communicator.backend}); call destroy() first")
    where = environment.placement()
    _group.communicator = _mpi(where, timeout) if backend == "mpi" else _nccl(where, timeout)


def _mpi(where: environment.Placement, timeout: float) -> Any:
    """MPI's world, checked against the launcher's and met by every rank."""
    from .mpi import MpiCommunicator

    communicator = MpiCommunicator(timeout)
    if communicator.world_size != where.world_size:
        how = ("mpiexec -n N python script.py, or python -m tensorcore.distributed.run --mpi --nproc-per-node N "
               "script.py")
        raise ValueError(f"init: mismatched world sizes: the launcher says {where.world_size} processes, MPI's "
                         f"world has {communicator.world_size}; MPI needs processes started by mpiexec ({how})")
    communicator.run("barrier", None, None)  # every rank arrived (or a timeout names the wait)
    return communicator


def _nccl(where: environment.Placement, timeout: float) -> Any:
    from . import nccl

    nccl.load_nccl()  # RuntimeError when CuPy, a GPU or NCCL is missing
    import cupy

    devices = cupy.cuda.runtime.getDeviceCount()
    if where.local_rank >= devices:
        raise ValueError(f"init('nccl'): LOCAL_RANK={where.local_rank} but this machine shows {devices} GPU(s); "
                         "start at most one process per GPU")
    cupy.cuda.Device(where.local_rank).use()
    uid = nccl.unique_id() if where.rank == 0 else None
    if where.launcher == "mpiexec":
        uid = _mpi(where, timeout).comm.bcast(uid, root=0)
    elif where.world_size > 1:
        uid = store.share(uid, where.rank, where.world_size, where.master_addr, where.master_port, timeout)
    return nccl.NcclCommunicator(where.rank, where.world_size, uid)


def destroy() -> None:
    """Leave the job: free the communicator (a no-op when not initialized)."""
    communicator, _group.communicator = _group.communicator, None
    if communicator is not None and communicator.backend == "nccl":
        communicator.close()


def is_initialized() -> bool:
    return _group.communicator is not None


def communicator(op: str) -> Any:
    """The communicator, for ``op`` (RuntimeError before ``init``)."""
    if _group.communicator is None:
        raise RuntimeError(f"{op}: tensorcore.distributed is not initialized; call tensorcore.distributed.init() "
                           "first")
    return _group.communicator


def get_rank() -> int:
    """This process's rank, 0 .. world size - 1."""
    return communicator("get_rank").rank


def get_world_size() -> int:
    """How many processes take part."""
    return communicator("get_world_size").world_size


def get_backend() -> str:
    """"nccl" or "mpi"."""
    return communicator("get_backend").backend
