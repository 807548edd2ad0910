"""Host tables (betas, ᾱ, σ, ...) and their device copies, made once per device and dtype."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

import tensorcore as tc


class DeviceTables:
    """Named host arrays, handed out as tensors on any device in any dtype.

    A copy is uploaded on first use and kept, so stepping never moves a table again.
    Safe to share between threads (two generations on one scheduler).
    """

    def __init__(self, host: dict[str, np.ndarray]) -> None:
        self.host = host
        self._device: dict[tuple[str, str, Any], tc.Tensor] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # copies and pickles keep the host tables only
        return {"host": self.host}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["host"])

    def get(self, name: str, device: str, dtype: Any = None) -> tc.Tensor:
        """Table ``name`` on ``device`` as ``dtype`` (default: the host array's dtype)."""
        host = self.host[name]
        dtype = host.dtype if dtype is None else np.dtype(dtype)
        key = (name, device, dtype)
        table = self._device.get(key)
        if table is None:
            with self._lock:
                table = self._device.get(key)
                if table is None:
                    table = tc.tensor(host.astype(dtype, copy=False), device=device)
                    self._device[key] = table
        return table
