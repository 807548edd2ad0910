"""Driving a ``Generation`` to its end: in the caller's thread, or under asyncio.

``run_sync`` calls prepare -> step x N -> finish -> collect in the calling thread.

``run_async`` calls the same methods in the same order, so the result is bit-identical,
with an ``await`` between steps: cancelling the task raises ``CancelledError`` at the
next step boundary (the step in flight completes first, so nothing outlives the call).

* CPU: each call runs in one worker thread shared by all generations (the event loop
  stays responsive, and two generations interleave step by step instead of running
  CPU kernels concurrently, which Numba's thread pool does not allow).
* GPU: the steps are queued on a CUDA stream of the generation's own from the event
  loop's thread; after queueing step k the driver awaits step k-1's event by polling
  it and yielding to the loop, so the host builds step k+1 while the GPU finishes the
  previous one, and at most two steps are queued when a cancellation arrives.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from tqdm.auto import tqdm

from tensorcore.compile.asynchronous import wait_event

from .generation import Generation
from .output import ImagePipelineOutput

_worker: ThreadPoolExecutor | None = None
_worker_lock = threading.Lock()


def _progress(generation: Generation) -> tqdm:
    return tqdm(total=generation.num_steps, disable=not generation.request.progress,
                desc=generation.pipeline.name, dynamic_ncols=True)


def run_sync(generation: Generation) -> ImagePipelineOutput:
    generation.prepare()
    with _progress(generation) as bar:
        for index in range(generation.num_steps):
            generation.step(index)
            bar.update(1)
            if not generation.keep_going(index):
                break
    return generation.collect(generation.finish())


async def run_async(generation: Generation) -> ImagePipelineOutput:
    if generation.device == "cuda":
        return await _run_on_stream(generation)
    return await _run_in_worker(generation)


# ----- CPU: one worker thread -----------------------------------------------------------
def cpu_worker() -> ThreadPoolExecutor:
    """The thread every CPU generation step runs in (created on first use)."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diffusion-generate")
        return _worker


async def _in_worker(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in the worker; a cancellation waits for it to finish, then propagates."""
    future = asyncio.get_running_loop().run_in_executor(cpu_worker(), fn, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait([future])
        raise


async def _run_in_worker(generation: Generation) -> ImagePipelineOutput:
    await _in_worker(generation.prepare)
    with _progress(generation) as bar:
        for index in range(generation.num_steps):
            await _in_worker(generation.step, index)
            bar.update(1)
            if not generation.keep_going(index):
                break
    images = await _in_worker(generation.finish)
    return await _in_worker(generation.collect, images)


# ----- GPU: a stream and event polling ----------------------------------------------------
async def _run_on_stream(generation: Generation) -> ImagePipelineOutput:
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    queued: deque = deque()
    try:
        with stream:
            generation.prepare()
        with _progress(generation) as bar:
            for index in range(generation.num_steps):
                with stream:
                    generation.step(index)
                queued.append(stream.record())
                if len(queued) > 1:
                    await wait_event(queued.popleft())
                bar.update(1)
                with stream:  # a callback reading the sample reads it in stream order
                    going = generation.keep_going(index)
                if not going:
                    break
        with stream:
            images = generation.finish()
        await wait_event(stream.record())
        with stream:
            return generation.collect(images)
    except asyncio.CancelledError:
        stream.synchronize()  # let the queued steps finish before their buffers are released
        raise
