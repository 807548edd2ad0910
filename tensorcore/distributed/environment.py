"""Where this process sits in a job: its rank, the world size, its local rank and the
master's address, read from the variables its launcher set.

Three launchers are recognised, in this order:

* ``python -m tensorcore.distributed.run`` (or torchrun, or by hand): ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``;
* ``mpiexec``: MPICH's ``PMI_RANK`` / ``PMI_SIZE`` / ``MPI_LOCALRANKID`` or Open MPI's
  ``OMPI_COMM_WORLD_*``;
* none: a lone process, rank 0 of 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

# (rank, size, local rank) variables of the mpiexec implementations
MPI_VARIABLES = (("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
                 ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"))


@dataclass(frozen=True)
class Placement:
    """This process's place in the job; ``launcher`` is "env", "mpiexec" or "none"."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str
    master_addr: str = "127.0.0.1"
    master_port: int | None = None


def placement(environ: Mapping[str, str] = os.environ) -> Placement:
    """Read the launcher's variables (ValueError names a variable that is malformed)."""
    mpi = next(((r, s, loc) for r, s, loc in MPI_VARIABLES if r in environ), None)
    if "RANK" in environ or "WORLD_SIZE" in environ:
        rank, world = _integer(environ, "RANK"), _integer(environ, "WORLD_SIZE")
        if mpi is not None and (rank, world) != (_integer(environ, mpi[0]), _integer(environ, mpi[1])):
            raise ValueError(f"RANK={rank} and WORLD_SIZE={world} disagree with mpiexec's {mpi[0]}="
                             f"{environ[mpi[0]]} and {mpi[1]}={environ[mpi[1]]}; start the processes one way")
        port = _integer(environ, "MASTER_PORT") if "MASTER_PORT" in environ else None
        if world > 1 and port is None:
            raise ValueError(f"WORLD_SIZE={world} but MASTER_PORT is not set: the ranks meet at "
                             "MASTER_ADDR:MASTER_PORT (python -m tensorcore.distributed.run sets both)")
        found = Placement(rank, world, _integer(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else rank,
                          "env", environ.get("MASTER_ADDR", "127.0.0.1"), port)
    elif mpi is not None:
        rank = _integer(environ, mpi[0])
        found = Placement(rank, _integer(environ, mpi[1]),
                          _integer(environ, mpi[2]) if mpi[2] in environ else rank, "mpiexec")
    else:
        return Placement(0, 1, 0, "none")
    if not 0 <= found.rank < found.world_size:
        raise ValueError(f"rank {found.rank} is outside the world of {found.world_size} processes")
    return found


def _integer(environ: Mapping[str, str], name: str) -> int:
    text = environ.get(name)
    try:
        value = int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"the environment variable {name} must be a non-negative integer, got {text!r}") from None
    if value < 0:
        raise ValueError(f"the environment variable {name} must be a non-negative integer, got {text!r}")
    return value
