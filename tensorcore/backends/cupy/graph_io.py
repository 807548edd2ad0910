"""A captured CUDA graph that copies its own inputs in and its outputs out.

A replayed plan computes from fixed input buffers into fixed output buffers, while the
caller hands new arrays on every call.  Copying them with one ``cudaMemcpyAsync`` per
array costs the host a driver call each, more than the graph launch itself.
``GraphIO`` moves those copies into the graph: its first nodes copy the caller's
inputs into the plan's buffers and its last nodes copy the outputs into arrays the
host allocated for the call.  The caller's addresses reach the device through a ring
of pointer rows in pinned, mapped host memory (cuda/graph_io.cu), written with plain
stores and read into device memory by the graph's first kernel, so a replay costs one
driver call: the graph launch.  The graph is kernels only (no memcpy node), the kind
of graph the driver launches fastest.

The ring has ``RING`` rows; launch k uses row k mod ``RING``.  The graph's last node
publishes how many launches have finished, and ``submit`` waits only while the host
is a whole ring ahead of the device.  A slot is skipped (pointer 0) when the plan's
buffer or the caller's array is not one dense block; the caller copies those itself.
"""

from __future__ import annotations

import ctypes
import time
import weakref
from typing import Any, Sequence

import cupy
import numpy as np

from . import loader
from .util import dense

SOURCE = "graph_io.cu"
RING = 32
_THREADS = 256
_MAPPED_PORTABLE = 0x2 | 0x1  # cudaHostAllocMapped | cudaHostAllocPortable: the device writes a word of it


class GraphIO:
    """The pointer ring and the copy nodes of one captured plan with ``inputs`` and
    ``outputs`` slots.

    Inside the capture, ``capture_inputs`` records the first nodes and
    ``capture_outputs`` the last ones; after it, ``upload`` sets the device's copy of
    the slots' buffers and sizes; before each launch ``submit`` fills the next ring
    row."""

    def __init__(self, inputs: int, outputs: int) -> None:
        self.n_in, self.width = inputs, max(1, inputs + outputs)
        words = (RING + 2) * self.width  # the ring, then each slot's plan buffer and byte count
        self.table_bytes = words * 8
        self.host = cupy.cuda.runtime.hostAlloc(self.table_bytes + 8, _MAPPED_PORTABLE)
        self._free = weakref.finalize(self, cupy.cuda.runtime.freeHost, self.host)
        table = np.ctypeslib.as_array((ctypes.c_uint64 * (words + 1)).from_address(self.host))
        table[:] = 0
        row_type = ctypes.c_uint64 * self.width  # ring row r at word r * width, one slot per word
        self.rows = [row_type.from_address(self.host + r * self.width * 8) for r in range(RING)]
        self.fixed = table[RING * self.width:(RING + 1) * self.width]
        self.nbytes = table[(RING + 1) * self.width:words]
        # launches the device has completed, as it published them, and as last read
        self.finished = ctypes.c_uint64.from_address(self.host + self.table_bytes)
        self.finished_seen = 0
        self.table = cupy.zeros(words, dtype=np.uint64)  # the device's copy: this launch's row, then the slots
        self.launches = cupy.zeros(1, dtype=np.uint64)  # the device's own count
        self.dense_in: list[bool] = []
        self.all_dense_in = True
        self.dense_out: list[bool] = []
        self.no_outputs = [0] * (self.width - inputs)  # a row's output slots when the plan keeps them
        self.submitted = 0

    def _copy_node(self, buffers: Sequence[Any], first: int, to_caller: bool) -> list[bool]:
        """Record the copy node for ``buffers`` (slots ``first``...); which are dense."""
        ok = [dense(b) for b in buffers]
        for i, (b, d) in enumerate(zip(buffers, ok)):
            self.fixed[first + i] = b.data.ptr if d else 0
            self.nbytes[first + i] = b.nbytes
        if any(ok):
            largest = max(b.nbytes for b, d in zip(buffers, ok) if d)
            blocks = loader.grid_for(-(-largest // 16), _THREADS)  # capped at a few per SM
            loader.kernel(SOURCE, "graph_io_copy_kernel")(
                (blocks, len(buffers)), (_THREADS,),
                (self.table, np.int32(RING), np.int32(self.width), self.launches, np.int32(first),
                 np.int32(to_caller)))
        return ok

    def capture_inputs(self, buffers: Sequence[Any]) -> None:
        """Record the fetch of the launch's ring row and the node copying the call's
        inputs into ``buffers`` (the first nodes)."""
        loader.kernel(SOURCE, "graph_io_fetch_kernel")(
            (1,), (min(_THREADS, self.width),),
            (np.uint64(self.host), self.table, np.int32(RING), np.int32(self.width), self.launches))
        self.dense_in = self._copy_node(buffers, 0, False)
        self.all_dense_in = all(self.dense_in)

    def capture_outputs(self, buffers: Sequence[Any]) -> None:
        """Record the nodes copying ``buffers`` out and closing the launch (the last)."""
        self.dense_out = self._copy_node(buffers, self.n_in, True)
        loader.kernel(SOURCE, "graph_io_finish_kernel")(
            (1,), (1,), (self.launches, np.uint64(self.host + self.table_bytes)))

    def upload(self) -> None:
        """After the capture: copy the slots' plan buffers and byte counts to the device
        (on the current stream, which the first launch must follow)."""
        start = RING * self.width * 8
        cupy.cuda.runtime.memcpyAsync(self.table.data.ptr + start, self.host + start, self.table_bytes - start,
                                      cupy.cuda.runtime.memcpyHostToDevice, cupy.cuda.get_current_stream().ptr)

    def submit(self, arrays: Sequence[Any], outputs: Sequence[Any] | None) -> list[int]:
        """Fill the next ring row with the caller's dense ``arrays`` and, unless None,
        the ``outputs`` allocated for this call (None entries are skipped).  Returns
        the inputs the row skipped: the caller copies those in itself before the
        launch."""
        if self.submitted - self.finished_seen >= RING:  # perhaps a whole ring ahead: look again
            while self.submitted - self.finished.value >= RING:
                time.sleep(0)
            self.finished_seen = self.finished.value
        row = [a.data.ptr if a._c_contiguous else 0 for a in arrays]
        skipped = []
        if not self.all_dense_in or 0 in row:
            row = [p if dense_slot else 0 for p, dense_slot in zip(row, self.dense_in)]
            skipped = [i for i, p in enumerate(row) if not p]
        if outputs is None:
            row += self.no_outputs
        else:
            row += [0 if out is None else out.data.ptr for out in outputs]
        self.rows[self.submitted % RING][:] = row  # one store of the row, not one per slot
        self.submitted += 1
        return skipped

    def release(self) -> None:
        """Free the pinned block (after the device has finished every launch)."""
        self._free()
