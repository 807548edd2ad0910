"""tensorcore.distributed on GPUs.

One GPU (``gpu``): a one-rank NCCL communicator in this process runs every collective
on every dtype against NumPy, and DistributedDataParallel trains the tiny digits UNet
equal to one process -- eagerly, with sharded optimizer state, under ``no_sync``, and
inside a ``tc.compile``d step whose replays are one CUDA graph holding the NCCL calls.
Several GPUs (``multigpu``): the same checks on 2, 4 and 8 ranks started by
``python -m tensorcore.distributed.run``, each rank's parameters equal to one GPU
trained on the global batch, ZeRO-1 equal to plain DDP.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

import tensorcore as tc
import tensorcore.distributed as dist
from distributed_worker import check_collectives, check_training

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def nccl_rank() -> Iterator[None]:
    dist.init("nccl", timeout=60)
    try:
        yield
    finally:
        dist.destroy()


@pytest.mark.gpu
def test_one_nccl_rank_runs_every_collective(nccl_rank: None) -> None:
    check_collectives("cuda")


@pytest.mark.gpu
def test_ddp_in_a_compiled_graph_captured_step_equals_one_eager_process(nccl_rank: None) -> None:
    check_training("cuda")


@pytest.mark.multigpu
@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_ranks_on_as_many_gpus_train_like_one_gpu(ranks: int) -> None:
    if tc.cuda.device_count() < ranks:
        pytest.skip(f"needs {ranks} GPUs")
    done = subprocess.run([sys.executable, "-m", "tensorcore.distributed.run", "--nproc-per-node", str(ranks),
                           str(REPO / "tests" / "distributed_worker.py"), "nccl", "collectives", "training"],
                          capture_output=True, text=True, timeout=900, cwd=REPO,
                          env={**os.environ, "TENSORCORE_BACKEND": "cupy"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["ok", "collectives", "ok", "training"]
