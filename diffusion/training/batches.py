"""Mini-batches from a dataset held on the device, in a reproducible shuffled order.

Each epoch visits the samples in a fresh permutation drawn from a host NumPy
generator; a batch is the next ``batch_size`` indices of it, gathered on the device.
The leftover samples at an epoch's end that do not fill a batch are skipped.  The
permutation, the position in it and the generator's state make up ``state()``, so a
resumed run draws exactly the batches the uninterrupted one would have.

In data-parallel training every rank walks the same permutation (same seed) and keeps
its share of each batch, every ``world_size``-th sample from position ``rank`` (as a
``DistributedSampler`` shards a dataset): the ranks' shares make up the batch a single
process would take.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import tensorcore as tc
from tensorcore import Tensor


class Batches:
    """Endless shuffled mini-batches over tensors that share their first dimension."""

    def __init__(self, tensors: tuple[Tensor, ...], batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1) -> None:
        self.tensors = tensors
        self.size = int(tensors[0].shape[0])
        if batch_size > self.size:
            raise ValueError(f"training: batch_size ({batch_size}) exceeds the number of samples ({self.size})")
        if batch_size % world_size:
            raise ValueError(f"training: batch_size ({batch_size}) must split evenly over {world_size} processes")
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.order = self.rng.permutation(self.size)
        self.offset = 0

    def next(self) -> tuple[Tensor, ...]:
        if self.offset + self.batch_size > self.size:
            self.order, self.offset = self.rng.permutation(self.size), 0
        picked = self.order[self.offset:self.offset + self.batch_size][self.rank::self.world_size]
        self.offset += self.batch_size
        index = tc.tensor(picked, device=self.tensors[0].device)
        return tuple(t[index] for t in self.tensors)

    def state(self) -> dict[str, Any]:
        return {"order": self.order.copy(), "offset": self.offset, "rng": self.rng.bit_generator.state}

    def load_state(self, state: dict[str, Any]) -> None:
        order = np.asarray(state["order"], np.int64)
        if order.shape != (self.size,):
            raise ValueError(f"training: the checkpoint's data order covers {order.shape[0]} samples, "
                             f"the dataset has {self.size}")
        self.rng.bit_generator.state = state["rng"]
        self.order, self.offset = order.copy(), int(state["offset"])
