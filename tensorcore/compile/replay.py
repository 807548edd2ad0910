"""Replay: a bound Plan run on every call, with no autograd, no tracing and no host sync.

``CpuReplay`` (NumPy and Numba backends) binds everything once: one allocation holds
the input buffers, the constants and the arena; every array a step touches -- inputs,
intermediates, views of either, the program's external buffers -- is built once from
its storage's address and its recorded geometry, so each step is a pre-bound call.  A
step is, in order of preference: the backend's ``prepare``d form of the call (the
kernel itself bound to its arrays, checks done once -- NumPy's ufuncs and matmul
writing into the arena, the Numba activation kernels), the method called with
``out=`` where it takes one (where, clip, concatenate), or the method called as in
eager mode with its result copied into the arena.  The first two allocate nothing
for the NumPy primitives; kernels that allocate their results (the Numba and fused
kernels) still do, and the copy puts the result in its planned buffer.  Replay is a
loop over those calls.

``CudaGraphReplay`` (CuPy) captures the steps into a CUDA graph on a private stream
(the trace has compiled every kernel and opened the capture-safe cuBLAS handle; a
separate warm-up run would repeat the plan's effects), with every allocation served by
a private memory pool: the pool is the plan's arena -- blocks freed during the capture
are reused by later kernels in stream order -- and it lives as long as the graph, so
every buffer the graph touches stays valid.  A call launches the graph on the
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

Both take the external buffers as live root arrays (``roots``, by storage) and the
opaque objects (random generators) by position, so a plan loaded from disk binds the
same way as a freshly traced one.
"""

from __future__ import annotations

import functools
import inspect
import sys
import weakref
from typing import Any, Callable

import numpy as np

from .. import versions
from .graph import Node, Ref, Value, substitute
from .plan import ALIGN, Plan, made_by
from .trace import address, owner


@functools.lru_cache(maxsize=None)
def _accepts_out(cls: type, name: str) -> bool:
    try:
        return "out" in inspect.signature(getattr(cls, name)).parameters
    except (TypeError, ValueError):
        return False


def _method(backend: Any, name: str) -> Callable:
    """The backend's own method (never a tracing wrapper on the instance)."""
    return getattr(type(backend), name).__get__(backend)


def _made_results(plan: Plan, node: Node) -> list[tuple[tuple[int, ...], int]]:
    """(path into the call's result, value) of each result the call allocated."""
    made = made_by(plan.graph, node)
    pairs: list[tuple[tuple[int, ...], int]] = []

    def walk(template: Any, path: tuple[int, ...]) -> None:
        if isinstance(template, Ref):
            if plan.graph.values[template.value].storage in made:
                pairs.append((path, template.value))
        elif isinstance(template, tuple):
            for i, item in enumerate(template):
                walk(item, path + (i,))

    walk(node.out, ())
    return pairs


def _nothing() -> None:
    pass


def _pick(result: Any, path: tuple[int, ...]) -> Any:
    for i in path:
        result = result[i]
    return result


def _flat_bytes(root: Any) -> Any:
    """A NumPy root's memory as a flat uint8 array starting at its lowest byte."""
    if root.flags.c_contiguous:
        return root.reshape(-1).view(np.uint8)
    if root.flags.f_contiguous:
        return root.T.reshape(-1).view(np.uint8)
    raise RuntimeError(f"compile: cannot bind a non-contiguous buffer of shape {root.shape} by address")


class CpuReplay:
    """A plan bound to NumPy memory, replayed as a loop of pre-bound calls."""

    def __init__(self, plan: Plan, backend: Any, roots: dict[int, Any], objects: list[Any]) -> None:
        graph = plan.graph
        align = ALIGN["cpu"]
        raw = np.empty(plan.fixed_bytes + plan.arena_bytes + align, np.uint8)
        start = -address(raw) % align
        self.memory = raw[start:start + plan.fixed_bytes + plan.arena_bytes]
        self.arena_bytes = plan.arena_bytes
        regions: dict[int, tuple[Any, int]] = {}
        for s, (kind, offset) in plan.placement.items():
            if kind == "external":
                regions[s] = (_flat_bytes(roots[s]), 0)  # value offsets count from the lowest byte
            else:
                regions[s] = (self.memory, offset + (plan.fixed_bytes if kind == "arena" else 0))
        self.values = [self._view(regions, v) if v.storage in regions else None for v in graph.values]
        self.objects = objects
        self.copy_, self.copy = _method(backend, "copy_"), _method(backend, "copy")
        for position in plan.init:
            self._step(plan, backend, graph.nodes[position])()
        self.steps = tuple(self._step(plan, backend, graph.nodes[position]) for position in plan.steps)
        self.inputs = [self.values[v] for v in graph.inputs]
        self.outputs = [self.values[r.value] for r in graph.output_refs()]
        self.writeback = [(i, self.inputs[i]) for i in plan.writeback]

    @staticmethod
    def _view(regions: dict[int, tuple[Any, int]], v: Value) -> Any:
        region, base = regions[v.storage]
        return np.ndarray(v.shape, v.dtype, buffer=region, offset=base + v.offset, strides=v.strides)

    def _step(self, plan: Plan, backend: Any, node: Node) -> Callable[[], Any]:
        copy_ = self.copy_
        made = _made_results(plan, node)
        if node.op == "constant":
            return functools.partial(copy_, self.values[made[0][1]], node.data)
        if node.op == "empty":  # an allocation: the plan has placed its storage already
            return _nothing
        fn = _method(backend, node.op)
        args = substitute(node.args, lambda r: self.values[r.value], lambda o: self.objects[o.index])
        kwargs = substitute(node.kwargs, lambda r: self.values[r.value], lambda o: self.objects[o.index])
        if not made:
            return functools.partial(fn, *args, **kwargs)
        dests = [(path, self.values[v]) for path, v in made]
        if made[0][0] == ():
            dest = dests[0][1]
            prepared = _method(backend, "prepare") if hasattr(type(backend), "prepare") else None
            fast = prepared(node.op, args, kwargs, dest) if prepared is not None and dest.flags.c_contiguous else None
            if fast is not None:
                return fast
            if "out" not in kwargs and self._out_form(type(backend), node.op, args, dest):
                return functools.partial(fn, *args, out=dest, **kwargs)
            return lambda: copy_(dest, fn(*args, **kwargs))

        def step() -> None:
            result = fn(*args, **kwargs)
            for path, dest in dests:
                copy_(dest, _pick(result, path))
        return step

    @staticmethod
    def _out_form(cls: type, name: str, args: tuple, dest: Any) -> bool:
        """Whether the kernel can write into ``dest`` itself: its method takes ``out=``,
        the destination is contiguous and no bfloat16 array is involved (those kernels
        compute on float32 copies)."""
        if not _accepts_out(cls, name) or not dest.flags.c_contiguous or dest.dtype.name == "bfloat16":
            return False
        return not any(getattr(getattr(a, "dtype", None), "name", "") == "bfloat16" for a in args)

    def run(self, arrays: list[Any], fresh: bool = True) -> list[Any]:
        """Copy the inputs in, run every step, write modified inputs back; the outputs
        are new arrays when ``fresh``, else the plan's own buffers."""
        copy_ = self.copy_
        for buf, a in zip(self.inputs, arrays):
            copy_(buf, a)
        for step in self.steps:
            step()
        for i, buf in self.writeback:
            copy_(arrays[i], buf)
        return [self.copy(a) for a in self.outputs] if fresh else self.outputs

    def release(self) -> None:
        self.steps, self.values, self.inputs, self.outputs, self.memory = (), [], [], [], None


class CudaGraphReplay:
    """A plan captured as one CUDA graph with its own stream and memory pool."""

    def __init__(self, plan: Plan, backend: Any, roots: dict[int, Any], objects: list[Any]) -> None:
        import cupy

        from ..backends.cupy import weight_packs
        from ..backends.cupy.graph_io import GraphIO

        self.cupy, self.plan, self.backend, self.objects = cupy, plan, backend, objects
        self.copy_, self.copy = _method(backend, "copy_"), _method(backend, "copy")
        graph = plan.graph
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.pool = cupy.cuda.MemoryPool()
        # What the backend keeps for this stream (convolution scratch, counters) is
        # allocated in this plan's pool during the capture, and dies with it: when the
        # plan goes without release(), those buffers must go too, before a new stream
        # reuses the handle and is handed freed memory.
        self.forget_stream = weakref.finalize(self, backend.release_stream, self.stream.ptr)
        self.handed_over = cupy.cuda.Event(disable_timing=True)  # the previous caller's stream, when it changes
        self.blocks: list[Any] = []
        with cupy.cuda.using_allocator(self.pool.malloc), self.stream:
            self.io = GraphIO(len(graph.inputs), len(graph.output_refs()))
            self.memory = cupy.empty(plan.fixed_bytes + ALIGN["cuda"], dtype=np.uint8)
            base = self.memory.data + (-self.memory.data.ptr % ALIGN["cuda"])
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
            self.stream.begin_capture()
            try:
                self.io.capture_inputs(self.inputs)
                with weight_packs.collecting(self.weight_packs):
                    for position in plan.steps:
                        self._run_node(graph.nodes[position], env, dynamic)
                self.outputs = [self._value(r.value, env, dynamic) for r in graph.output_refs()]
                self.io.capture_outputs(self.outputs)
            finally:
                self.graph = self.stream.end_capture()
            self.io.upload()
        # a new set of output arrays is all views of one block (one pool allocation
        # however many outputs; the block lives while any of them does):
        # (shape, dtype, byte offset) of each output the graph copies out, None for those
        # copied by the host
        self.fresh: list[tuple[Any, Any, int] | None] = []
        block = 0
        for b, ok in zip(self.outputs, self.io.dense_out):
            self.fresh.append((b.shape, b.dtype, block) if ok else None)
            block += -(-b.nbytes // ALIGN["cuda"]) * ALIGN["cuda"] if ok else 0
        self.fresh_bytes = block
        # the last calls' output sets, each with the handle of the stream it was made on
        self.handed_out: list[tuple[int, list[Any]]] = []
        self.env = env  # every array the graph touches lives as long as the graph
        self.writeback = [(i, self.inputs[i]) for i in plan.writeback]
        self.arena_bytes = int(self.pool.total_bytes())
        # the stream of the previous call; at first the plan's own, so the first call
        # waits for the constants and the I/O counters it set up there
        self.last_user: Any = self.stream

    def _array(self, pointer: Any, v: Value) -> Any:
        return self.cupy.ndarray(v.shape, v.dtype, memptr=pointer, strides=v.strides)

    def _value(self, index: int, env: dict[int, Any], dynamic: dict[int, Any]) -> Any:
        """Value ``index``: bound already, or a view into memory a captured step made
        (``dynamic`` holds each such storage's lowest byte)."""
        found = env.get(index)
        if found is None:
            v = self.plan.graph.values[index]
            found = env[index] = self._array(dynamic[v.storage] + v.offset, v)
        return found

    def _run_node(self, node: Node, env: dict[int, Any], dynamic: dict[int, Any]) -> None:
        """Run one call; the results it allocated become the memory of their storages."""
        graph = self.plan.graph
        made = _made_results(self.plan, node)
        if node.op == "constant":  # copy the captured data in, whatever its layout
            (_, v), = made
            s = graph.storages[graph.values[v].storage]
            if v not in env:
                block = self.cupy.empty(s.nbytes, dtype=np.uint8)
                self.blocks.append(block)  # the graph writes it: it lives as long as the graph
                dynamic[s.index] = block.data
            self._value(v, env, dynamic)[...] = node.data
            return
        args = substitute(node.args, lambda r: self._value(r.value, env, dynamic), lambda o: self.objects[o.index])
        kwargs = substitute(node.kwargs, lambda r: self._value(r.value, env, dynamic), lambda o: self.objects[o.index])
        result = _method(self.backend, node.op)(*args, **kwargs)
        for path, v in made:
            array = _pick(result, path)
            s = graph.storages[graph.values[v].storage]
            if v in env:  # a constant, computed into its fixed block
                env[v][...] = array
                continue
            root = owner(array)
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
        user = self.cupy.cuda.get_current_stream()
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
        new, block = self.cupy.ndarray, self.cupy.cuda.alloc(self.fresh_bytes) if self.fresh_bytes else None
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
        self.weight_packs = None
        self.forget_stream()  # the buffers the backend kept for the capture (once)
        self.io.release()
        self.pool.free_all_blocks()


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


def bind(plan: Plan, backend: Any, roots: dict[int, Any], objects: list[Any]) -> CpuReplay | CudaGraphReplay:
    """The executor for ``plan`` on ``backend``."""
    if plan.graph.device == "cuda":
        return CudaGraphReplay(plan, backend, roots, objects)
    return CpuReplay(plan, backend, roots, objects)


_HELD_ONCE = _held_once()
