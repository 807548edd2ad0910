"""The CUDA-graph executor of compiled plans: ``CupyBackend.executor``.

``CudaGraphReplay`` (CuPy) captures the steps into a CUDA graph on a private stream
(the trace has compiled every kernel and opened the capture-safe cuBLAS handle; a
separate warm-up run would repeat the plan's effects), with every allocation served by
a private memory pool: the pool is the plan's arena -- each intermediate is dropped
after the last step that touches it (``Plan.storages_ending``), and its block is reused
by later kernels in stream order -- and it lives as long as the graph, so every buffer
the graph touches stays valid.  A call launches the graph on the
caller's stream (a graph runs on whichever stream launches it), and the graph copies
the call's inputs in and its outputs out itself (``backends/cupy/graph_io.py``), so
stream order alone puts the launch after the caller's earlier work and the caller's
next work after the launch; the host never synchronizes.  A caller on another stream
than the previous one first waits for that stream, so the previous caller's outputs
are copied out before they are overwritten; the first caller waits for the plan's own
stream, where the constants and the I/O counters were set up.  The output arrays a
call returns are new, or those of one of the last two calls on the same stream when
nothing else holds them any more (``_fresh_outputs``).  Convolution weights the plan
only reads are packed outside the graph and packed again only after a write into
their memory (``backends/cupy/weight_packs.py``, by their storages' write versions).

It takes the external buffers as live root arrays (``roots``, by storage) and the
opaque objects (random generators) by position, so a plan loaded from disk binds the
same way as a freshly traced one.  The plan is read through its own methods and fields
(``Plan`` in ``tensorcore/compile/plan.py``); nothing here imports the compiler.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import cupy
import numpy as np

from ... import versions
from ..numpy.executor import own_method, pick
from . import conv_igemm, pools, weight_packs
from .graph_io import GraphIO


class CudaGraphReplay:
    """A plan captured as one CUDA graph with its own stream and memory pool."""

    def __init__(self, plan: Any, backend: Any, roots: dict[int, Any], objects: list[Any]) -> None:
        self.plan, self.backend, self.objects = plan, backend, objects
        self.copy_, self.copy = own_method(backend, "copy_"), own_method(backend, "copy")
        graph = plan.graph
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.pool = cupy.cuda.MemoryPool()
        pools.register(self, self.pool)
        # What the backend keeps for this stream (convolution scratch, counters) is
        # allocated in this plan's pool during the capture, and dies with it: when the
        # plan goes without release(), those buffers must go too, before a new stream
        # reuses the handle and is handed freed memory.
        self.forget_stream = weakref.finalize(self, backend.release_stream, self.stream.ptr)
        self.handed_over = cupy.cuda.Event(disable_timing=True)  # the previous caller's stream, when it changes
        self.blocks: list[Any] = []
        with cupy.cuda.using_allocator(self.pool.malloc), self.stream:
            self.io = GraphIO(len(graph.inputs), len(graph.output_refs()))
            self.memory = cupy.empty(plan.fixed_bytes + plan.align, dtype=np.uint8)
            base = self.memory.data + (-self.memory.data.ptr % plan.align)
            fixed = {}
            for v in graph.values:
                kind, offset = plan.placement.get(v.storage, ("arena", 0))
                if kind == "external":
                    fixed[v.index] = self._array(roots[v.storage].data + (v.offset - graph.storages[v.storage].origin), v)
                elif kind != "arena":
                    fixed[v.index] = self._array(base + offset + v.offset, v)
            for position in plan.init:  # constants, once
                self._run_node(graph.nodes[position], fixed, {})
            # No warm-up run: the trace already compiled every kernel and opened the cuBLAS
            # handle, and a run would repeat the plan's effects (an optimizer step, a draw).
            env, dynamic = dict(fixed), {}
            for position in plan.steps:  # generated kernels are compiled before the capture
                node = graph.nodes[position]
                if node.op == "fused_elementwise":
                    backend.warm_fused(node.args[0], len(graph.values[node.out.value].shape))
                elif node.op == "lora_linear":  # only compiled plans call it: not loaded by the trace
                    backend.warm_lora_linear(graph.values[node.out.value].dtype)
            self.inputs = [env[v] for v in graph.inputs]
            # convolution weights in memory the plan only reads are packed outside the
            # graph, again only after their memory was written (weight_packs)
            self.weight_packs = weight_packs.WeightPacks(_read_only_spans(graph, roots))
            backend.reserve_stream()  # its counters made now: a memset node slows every launch
            # the capture allocates first fit inside one block sized from the plan's own
            # placement, with room for the kernels' temporaries (pools.CaptureArena)
            room = plan.arena_bytes // 4 + min(ARENA_SLACK, plan.arena_bytes // 4)
            self.arena = pools.CaptureArena(self.pool, max(plan.arena_bytes + room, plan.align), plan.align)
            ending = plan.storages_ending()
            values_of: dict[int, list[int]] = {}  # storage -> its values
            for v in graph.values:
                values_of.setdefault(v.storage, []).append(v.index)
            self.stream.begin_capture()
            try:
                self.io.capture_inputs(self.inputs)
                with weight_packs.collecting(self.weight_packs), pools.capturing_plan(), \
                        cupy.cuda.using_allocator(self.arena.malloc):
                    for step, position in enumerate(plan.steps):
                        self._run_node(graph.nodes[position], env, dynamic)
                        for s in ending.get(step, ()):
                            _forget(s, values_of[s], env, dynamic)
                self.outputs = [self._value(r.value, env, dynamic) for r in graph.output_refs()]
                self.io.capture_outputs(self.outputs)
            finally:
                self.graph = self.stream.end_capture()
            self.io.upload()
        conv_igemm.release_uncaptured_scratch()  # what the trace's eager convolutions grew
        # a new set of output arrays is all views of one block (one pool allocation
        # however many outputs; the block lives while any of them does):
        # (shape, dtype, byte offset) of each output the graph copies out, None for those
        # copied by the host
        self.fresh: list[tuple[Any, Any, int] | None] = []
        block = 0
        for b, ok in zip(self.outputs, self.io.dense_out):
            self.fresh.append((b.shape, b.dtype, block) if ok else None)
            block += -(-b.nbytes // plan.align) * plan.align if ok else 0
        self.fresh_bytes = block
        # the last calls' output sets, each with the handle of the stream it was made on
        self.handed_out: list[tuple[int, list[Any]]] = []
        self.env = env  # the arrays still bound (inputs, outputs, constants) live with the graph
        self.writeback = [(i, self.inputs[i]) for i in plan.writeback]
        self.arena_bytes = int(self.pool.total_bytes())
        # the stream of the previous call; at first the plan's own, so the first call
        # waits for the constants and the I/O counters it set up there
        self.last_user: Any = self.stream

    def _array(self, pointer: Any, v: Any) -> Any:
        return cupy.ndarray(v.shape, v.dtype, memptr=pointer, strides=v.strides)

    def _value(self, index: int, env: dict[int, Any], dynamic: dict[int, Any]) -> Any:
        """Value ``index``: bound already, or a view into memory a captured step made
        (``dynamic`` holds each such storage's lowest byte)."""
        found = env.get(index)
        if found is None:
            v = self.plan.graph.values[index]
            found = env[index] = self._array(dynamic[v.storage] + v.offset, v)
        return found

    def _run_node(self, node: Any, env: dict[int, Any], dynamic: dict[int, Any]) -> None:
        """Run one call; the results it allocated become the memory of their storages."""
        graph = self.plan.graph
        made = self.plan.made_results(node)
        if node.op == "constant":  # copy the captured data in, whatever its layout
            (_, v), = made
            s = graph.storages[graph.values[v].storage]
            if v not in env:
                block = cupy.empty(s.nbytes, dtype=np.uint8)
                self.blocks.append(block)  # the graph writes it: it lives as long as the graph
                dynamic[s.index] = block.data
            self._value(v, env, dynamic)[...] = node.data
            return
        args, kwargs = self.plan.call_arguments(node, lambda v: self._value(v, env, dynamic), self.objects.__getitem__)
        result = own_method(self.backend, node.op)(*args, **kwargs)
        for path, v in made:
            array = pick(result, path)
            s = graph.storages[graph.values[v].storage]
            if v in env:  # a constant, computed into its fixed block
                env[v][...] = array
                continue
            root = versions.storage(array)
            if (tuple(root.shape), tuple(root.strides), root.dtype) != s.root:
                raise RuntimeError(f"compile: {node.op} returned a result laid out differently from the trace")
            dynamic[s.index] = root.data + (-s.origin)
            env[v] = array

    def run(self, arrays: list[Any], fresh: bool = True) -> list[Any]:
        """Inputs in, one graph launch, outputs ready: all on the caller's stream, so the
        call is ordered after what the caller queued before it and before what it queues
        next, with no event of its own.  The graph copies the inputs in and, when
        ``fresh``, the outputs out into arrays allocated here (``GraphIO``); without
        ``fresh`` the outputs are the plan's own buffers."""
        user = cupy.cuda.get_current_stream()
        if self.last_user.ptr != user.ptr:
            # the previous caller's launch and its copies of the outputs (enqueued before
            # this call could take the plan) come before this launch overwrites them
            self.handed_over.record(self.last_user)
            user.wait_event(self.handed_over)
        self.last_user = user
        outputs = self._fresh_outputs(user.ptr) if fresh else None
        for i in self.io.submit(arrays, outputs):
            self.copy_(self.inputs[i], arrays[i])
        self.weight_packs.refresh()
        self.graph.launch(user)
        for i, buf in self.writeback:
            self.copy_(arrays[i], buf)
        if outputs is None:
            return self.outputs
        return [self.copy(b) if out is None else out for out, b in zip(outputs, self.outputs)]

    def _fresh_outputs(self, stream: int) -> list[Any]:
        """This call's own output arrays: a set of an earlier call on this stream whose
        arrays nobody else holds any more (the common loop: step k + 1 runs while step
        k's outputs are its inputs, and step k - 1's were dropped), or a new set, views
        of one block from the memory pool.  Reusing a set spares the allocation and the
        array objects, which cost the host more than the launch; as for the pool's own
        blocks, reuse is ordered on the stream that last wrote them."""
        handed_out = self.handed_out
        for position, (owner_stream, arrays) in enumerate(handed_out):
            if owner_stream == stream and _unreferenced(arrays):
                handed_out.append(handed_out.pop(position))
                return arrays
        new, block = cupy.ndarray, cupy.cuda.alloc(self.fresh_bytes) if self.fresh_bytes else None
        arrays = [None if spec is None else new(spec[0], spec[1], block + spec[2]) for spec in self.fresh]
        handed_out.append((stream, arrays))
        if len(handed_out) > RECYCLED_SETS:
            del handed_out[0]
        return arrays

    def release(self) -> None:
        if self.last_user is not None:  # the pointer ring must outlive the launches in flight
            self.last_user.synchronize()
        self.graph = self.env = self.memory = self.last_user = None
        self.inputs, self.outputs, self.writeback, self.blocks, self.handed_out = [], [], [], [], []
        self.weight_packs = self.arena = None
        self.forget_stream()  # the buffers the backend kept for the capture (once)
        self.io.release()
        self.pool.free_all_blocks()


def _forget(storage: int, values: list[int], env: dict[int, Any], dynamic: dict[int, Any]) -> None:
    """Drop every reference to an intermediate no later step touches: its block goes
    back to the plan's pool and later captured kernels reuse it in stream order (the
    pool keeps it for the graph's lifetime), so the plan holds its largest live set
    rather than every intermediate at once."""
    dynamic.pop(storage, None)
    for v in values:
        env.pop(v, None)


ARENA_SLACK = 16 << 20  # at most this many bytes of a capture's arena beyond 5/4 of the plan's placement
RECYCLED_SETS = 2  # output sets a CUDA-graph replay keeps to hand out again


def _read_only_spans(graph: Any, roots: dict[int, Any]) -> list[tuple[int, int, versions.WriteVersion]]:
    """(lowest, past-the-end) device addresses and write version of each external storage
    (the modules' parameters and buffers) that no node of ``graph`` writes."""
    spans = []
    for s in graph.storages:
        if s.kind == "external" and not s.written:
            lowest = roots[s.index].data.ptr - s.origin
            spans.append((lowest, lowest + s.nbytes, versions.counter(roots[s.index])))
    return spans


def _held_once() -> int:
    """What ``sys.getrefcount`` says, through ``_unreferenced``'s own loop, of an object
    held by one list and nothing else (the interpreter's own temporary references vary
    across versions: measured rather than assumed)."""
    return _counts([object()])[0]


def _counts(arrays: list[Any]) -> list[int]:
    return [sys.getrefcount(a) for a in arrays]


def _unreferenced(arrays: list[Any]) -> bool:
    """Whether the set's list is the only holder of each of its arrays."""
    return all(count <= _HELD_ONCE for count, a in zip(_counts(arrays), arrays) if a is not None)


_HELD_ONCE = _held_once()
