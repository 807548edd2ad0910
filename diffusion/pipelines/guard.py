"""The non-finite guard: NaN and ±Inf in a sample replaced on the device, and counted.

NaN becomes 0 and ±Inf the largest finite value of the dtype with its sign (what
``numpy.nan_to_num`` does).  The count of replaced values accumulates in a device
scalar, so guarding a step costs no host round trip; the pipeline reads it once, when
the generation ends.  ``replace_nonfinite`` is the device part alone (tensors in,
tensors out), so a compiled denoise step carries the guard inside its plan.
"""

from __future__ import annotations

import numpy as np

from tensorcore import Tensor
from tensorcore.backends import backend_for


def _finfo(dtype: np.dtype) -> Any:
    """The float limits of ``dtype``: NumPy's finfo does not know bfloat16 on every release."""
    if dtype.kind == "f":
        return np.finfo(dtype)
    import ml_dtypes  # a bfloat16 array exists, so it is imported already

    return ml_dtypes.finfo(dtype)


def replace_nonfinite(sample: Tensor, total: Tensor) -> tuple[Tensor, Tensor]:
    """(``sample`` with NaN -> 0 and ±Inf -> ±largest finite, ``total`` + how many were replaced);
    ``total`` is an int64 0-d tensor on the sample's device."""
    backend = backend_for(sample.device)
    x = sample.data
    nan = backend.unary("isnan", x)
    bad = backend.binary("logical_or", nan, backend.unary("isinf", x))
    found = backend.reduce("sum", backend.astype(bad, np.int64), None, False)
    finite = _finfo(x.dtype)
    clipped = backend.clip(x, float(finite.min), float(finite.max))
    clean = backend.where(nan, backend.zeros((), x.dtype), clipped)
    return Tensor(clean, sample.device), Tensor(backend.binary("add", total.data, found), sample.device)


class NonFiniteGuard:
    """Call it on each sample of one generation; ``count()`` reads the total once.

    ``total`` is the running count on the device (None before the first sample), for
    callers that guard through ``replace_nonfinite`` themselves and hand it back.
    """

    def __init__(self) -> None:
        self.total: Tensor | None = None

    def __call__(self, sample: Tensor) -> Tensor:
        clean, self.total = replace_nonfinite(sample, self.running_total(sample.device))
        return clean

    def running_total(self, device: str) -> Tensor:
        """The device counter (a zero made on ``device`` on first use)."""
        if self.total is None:
            backend = backend_for(device)
            self.total = Tensor(backend.zeros((), np.int64), device)
        return self.total

    def count(self) -> int:
        """How many values were replaced so far (reads the device counter)."""
        if self.total is None:
            return 0
        return int(self.total.numpy())
