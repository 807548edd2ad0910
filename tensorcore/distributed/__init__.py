"""Data-parallel training over many processes: NCCL across GPUs, MPI across CPU processes.

    import tensorcore.distributed as dist
    dist.init("nccl")                      # or "mpi"; rank and world from the launcher
    model = dist.DistributedDataParallel(model)
    ...                                    # each rank trains on its shard of the data

Launch with ``python -m tensorcore.distributed.run --nproc-per-node N script.py`` or
``mpiexec -n N python script.py``; see docs/distributed.md.
"""

from .collectives import REDUCE_OPS, all_gather, all_reduce, barrier, broadcast, reduce_scatter
from .ddp import DistributedDataParallel
from .group import BACKENDS, destroy, get_backend, get_rank, get_world_size, init, is_initialized
from .sampler import DistributedSampler

__all__ = ["BACKENDS", "DistributedDataParallel", "DistributedSampler", "REDUCE_OPS", "all_gather", "all_reduce",
           "barrier", "broadcast", "destroy", "get_backend", "get_rank", "get_world_size", "init", "is_initialized",
           "reduce_scatter"]
