"""The non-finite guard: NaN and ±Inf in a sample replaced on the device, and counted.

NaN becomes 0 and ±Inf the largest finite value of the dtype with its sign (what
``numpy.nan_to_num`` does).  The count of replaced values accumulates in a device
scalar, so guarding a step costs no host round trip; the pipeline reads it once, when
the generation ends.
"""

from __future__ import annotations

import numpy as np

from tensorcore import Tensor
from tensorcore.backends import backend_for


class NonFiniteGuard:
    """Call it on each sample of one generation; ``count()`` reads the total once."""

    def __init__(self) -> None:
        self._count = None
        self._backend = None

    def __call__(self, sample: Tensor) -> Tensor:
        backend = backend_for(sample.device)
        x = sample.data
        nan = backend.unary("isnan", x)
        bad = backend.binary("logical_or", nan, backend.unary("isinf", x))
        found = backend.reduce("sum", backend.astype(bad, np.int64), None, False)
        self._count = found if self._count is None else backend.binary("add", self._count, found)
        self._backend = backend
        finite = np.finfo(x.dtype)
        clipped = backend.clip(x, float(finite.min), float(finite.max))
        return Tensor(backend.where(nan, backend.zeros((), x.dtype), clipped), sample.device)

    def count(self) -> int:
        """How many values were replaced so far (reads the device counter)."""
        if self._count is None:
            return 0
        return int(self._backend.to_numpy(self._count))
