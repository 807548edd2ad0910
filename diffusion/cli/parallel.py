"""``train --devices N``: one command line trained data-parallel by N processes.

The command as typed starts the ranks (``tensorcore.distributed.run``: N processes with
the launcher's variables for ``--backend nccl``, or through ``mpiexec`` for ``mpi``), each
running the same command line with one ``--out`` for all; a rank joins the job before it
builds its model, so that ``train_ddpm`` trains data-parallel.  Rank 0 prints, writes
the run folder and samples; the other ranks only train.
"""

from __future__ import annotations

import argparse
import sys

import tensorcore as tc
from tensorcore import distributed
from tensorcore.distributed import environment, run

from .args import UsageError
from .runs import planned_out


def default_backend() -> str:
    """NCCL when the models live on the GPU, MPI for CPU processes."""
    return "nccl" if tc.get_backend().device == "cuda" else "mpi"


def starts_ranks(args: argparse.Namespace) -> bool:
    """Whether this process should start the ranks (``--devices`` > 1, not one of them yet)."""
    return args.devices > 1 and environment.placement().launcher == "none"


def launch(argv: list[str], args: argparse.Namespace) -> int:
    """Run the command as ``args.devices`` ranks; their exit status."""
    out = [] if args.out is not None or args.resume is not None else ["--out", planned_out(None, args.command)]
    command = [sys.executable, "-m", "diffusion", *argv, *out]
    return run.launch(command, args.devices, mpi=(args.backend or default_backend()) == "mpi")


def join(args: argparse.Namespace) -> int:
    """Join the job when ``--devices`` > 1; this process's rank (0 alone)."""
    if args.devices == 1:
        return 0
    backend = args.backend or default_backend()
    try:
        distributed.init(backend)
    except (RuntimeError, ValueError) as exc:
        raise UsageError(f"--devices {args.devices} --backend {backend}: {exc}") from None
    if distributed.get_world_size() != args.devices:
        raise UsageError(f"--devices {args.devices}, but {distributed.get_world_size()} processes were started")
    return distributed.get_rank()
