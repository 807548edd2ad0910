"""Sharded optimizer state (ZeRO stage 1): ``optimizer.shard_state()``.

Under ``tensorcore.distributed``, every rank holds the same parameters and, after
DistributedDataParallel's all-reduce, the same gradients, so every rank would compute
the same update: sharding splits that work and its state.  Each flat buffer's sections
(``flat.py``) are cut into world-size equal slices -- their length padded to a
multiple of world size x 256 bytes, so every slice starts aligned -- and rank r keeps
the optimizer state of slice r only (its state sections are 1/world as long), runs
the fused update on slice r of the parameters and gradients, then the parameter
section is all-gathered so every rank holds every updated value.  Parameters and
gradients stay whole.  A slice may cut a parameter in two, which suits the
element-wise updates; LAMB and LARS (per-parameter norms) refuse to shard.
"""

from __future__ import annotations

from typing import Any

from .flat import ALIGN_BYTES


class Shard:
    """This rank's slice of every flat buffer, and the all-gather that reassembles them."""

    def __init__(self, communicator: Any) -> None:
        self.communicator = communicator
        self.rank, self.world_size = communicator.rank, communicator.world_size

    @classmethod
    def of_process_group(cls, op: str) -> "Shard":
        from tensorcore.distributed import group  # optim loads the distributed package only when asked to shard

        return cls(group.communicator(op))

    def padded(self, length: int, itemsize: int) -> int:
        """``length`` rounded up so that it splits into aligned slices, one per rank."""
        unit = self.world_size * (ALIGN_BYTES // itemsize)
        return -(-length // unit) * unit

    def bounds(self, length: int) -> tuple[int, int]:
        """[start, stop) of this rank's slice of a section of ``length`` (a padded length)."""
        size = length // self.world_size
        return self.rank * size, (self.rank + 1) * size

    def gather(self, backend: Any, whole: Any, part: Any) -> None:
        """Every rank's ``part`` (its slice of ``whole``) into ``whole``, on every rank."""
        if backend.device != self.communicator.device:
            raise ValueError(f"shard_state: the parameters are on {backend.device}, the "
                             f"{self.communicator.backend} backend works on {self.communicator.device}")
        backend.collective_(whole, part, self.communicator, "all_gather")
