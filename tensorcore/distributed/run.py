"""The launcher: ``python -m tensorcore.distributed.run --nproc-per-node N script.py args...``

Starts N copies of the script (or of ``-m module``) on this machine, each with
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and a free
``MASTER_PORT`` set, and waits for them.  When one fails, the others are stopped (a
rank waiting in a collective for a dead peer would wait for ever) and the launcher
exits with the failed rank's status.  ``--mpi`` starts them through ``mpiexec``
instead, which the ``mpi`` backend needs (one MPI world).  Every process starts with
``NCCL_NVLS_ENABLE=0``: NVLink multicast stays off.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Sequence

GRACE_SECONDS = 5.0  # how long a stopped rank gets to exit before it is killed
FIXED_ENVIRONMENT = {"NCCL_NVLS_ENABLE": "0"}


def launch(command: Sequence[str], nprocs: int, mpi: bool = False, master_addr: str = "127.0.0.1",
           master_port: int | None = None) -> int:
    """Run ``command`` (argv) as ``nprocs`` ranks; returns 0 or the first failure's status."""
    if nprocs < 1:
        raise ValueError(f"launch: nprocs must be >= 1, got {nprocs}")
    base = {**os.environ, **FIXED_ENVIRONMENT}
    if mpi:
        return subprocess.call([mpiexec(), "-n", str(nprocs), *command], env=base)
    port = master_port or free_port()
    ranks = []
    for rank in range(nprocs):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nprocs),
               "LOCAL_WORLD_SIZE": str(nprocs), "MASTER_ADDR": master_addr, "MASTER_PORT": str(port)}
        ranks.append(subprocess.Popen(list(command), env=env))
    return _supervise(ranks)


def _supervise(ranks: list[subprocess.Popen]) -> int:
    """Wait for every rank; at the first failure stop the rest and return its status."""
    try:
        while True:
            statuses = [p.poll() for p in ranks]
            failed = next((s for s in statuses if s not in (None, 0)), None)
            if failed is not None:
                rank = statuses.index(failed)
                print(f"tensorcore.distributed.run: rank {rank} exited with status {failed}; stopping the others",
                      file=sys.stderr)
                _stop(ranks)
                return failed
            if all(s == 0 for s in statuses):
                return 0
            time.sleep(0.05)
    except KeyboardInterrupt:
        _stop(ranks)
        return 130


def _stop(ranks: list[subprocess.Popen]) -> None:
    """SIGTERM every rank still running, SIGKILL those still there after the grace time."""
    for p in ranks:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    for p in ranks:
        try:
            p.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def free_port() -> int:
    """A TCP port nobody listens on now (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def mpiexec() -> str:
    """The mpiexec beside this Python (a virtual environment's, from the mpich wheel) or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("tensorcore.distributed.run --mpi: no mpiexec found; pip install mpich (or install "
                           "an MPI runtime)")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tensorcore.distributed.run",
                                     description="Start N ranks of a script on this machine.")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="processes to start (default: 1)")
    parser.add_argument("--mpi", action="store_true", help="start them with mpiexec (for init('mpi'))")
    parser.add_argument("--master-addr", default="127.0.0.1", help="where rank 0 listens (default: %(default)s)")
    parser.add_argument("--master-port", type=int, default=None, help="(default: a free port)")
    parser.add_argument("-m", dest="module", default=None, help="run a module, as python -m does")
    parser.add_argument("script", nargs="?", help="the script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    if args.module is None and args.script is None:
        parser.error("give a script or -m module")
    if args.nproc_per_node < 1:
        parser.error(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
    if args.module is not None:  # what argparse took for the script is the module's first argument
        target = ["-m", args.module, *([args.script] if args.script else []), *args.args]
    else:
        target = [args.script, *args.args]
    return launch([sys.executable, *target], args.nproc_per_node, args.mpi, args.master_addr, args.master_port)


if __name__ == "__main__":
    sys.exit(main())
