"""``DistributedSampler``: each rank's share of a dataset's indices, epoch by epoch.

As ``torch.utils.data.DistributedSampler``: every epoch the indices are shuffled with
one seed on all ranks (``seed + epoch``), padded by repeating the first ones to a
multiple of the world size (or cut to one, ``drop_last``), and rank r takes every
world-size-th index starting at r.  The ranks' shares are disjoint and together
cover the dataset.  The permutation is NumPy's (PCG64), not torch's.
"""

from __future__ import annotations

from typing import Iterator, Sized

import numpy as np

from . import group


class DistributedSampler:
    """Indices of this rank's share of ``dataset`` (a length or anything with ``len``)."""

    def __init__(self, dataset: Sized | int, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        self.size = dataset if isinstance(dataset, int) else len(dataset)
        self.num_replicas = group.get_world_size() if num_replicas is None else num_replicas
        self.rank = group.get_rank() if rank is None else rank
        if self.num_replicas < 1 or not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"DistributedSampler: rank {self.rank} is not in 0..{self.num_replicas - 1}")
        if self.size < 0 or (drop_last and self.size < self.num_replicas):
            raise ValueError(f"DistributedSampler: a dataset of {self.size} samples cannot be split over "
                             f"{self.num_replicas} ranks with drop_last={drop_last}")
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0

    def __len__(self) -> int:
        if self.drop_last:
            return self.size // self.num_replicas
        return -(-self.size // self.num_replicas)

    def set_epoch(self, epoch: int) -> None:
        """Shuffle differently in each epoch (call it before iterating, on every rank)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            order = np.random.Generator(np.random.PCG64(self.seed + self.epoch)).permutation(self.size)
        else:
            order = np.arange(self.size)
        total = len(self) * self.num_replicas
        order = order[:total] if self.drop_last else np.resize(order, total)
        return iter(order[self.rank::self.num_replicas].tolist())
