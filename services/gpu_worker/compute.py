"""The worker's one compute thread: the only thread of the process that runs torch on more
than one core.

Each thread that starts parallel torch work leads an OpenMP team of its own, and the teams'
threads stay. Measured on 2 cores (bf16, batch-8 decode steps, 256-token contexts, one
process): steps on a pool thread ran 20-23 ms when the model had loaded on the main thread
with 2 threads, 14-15.5 ms when the main thread never ran parallel work, the same as steps
on the main thread itself. So the model loads, warms up and steps here, and the thread that
built this one (the event loop's) drops to one torch thread.

NOTE: torch keeps one count per thread, taken from the last count set anywhere the first
time a thread asks (``at::internal::lazy_init_num_threads``): each count is set here after
that first read, so a later ``set_num_threads`` elsewhere cannot change it.
"""

from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

import torch

T = TypeVar("T")


class ComputeThread:
    """``call(fn, ...)`` runs ``fn`` on the compute thread and waits; ``await run(fn, ...)``
    does it from the event loop. Work runs one item at a time, in the order submitted."""

    def __init__(self, threads: int, release_caller: bool = True) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        if release_caller:
            _pin(1)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")
        self.call(_pin, threads)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        return self._pool.submit(fn, *args).result()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """With the caller's context (as ``asyncio.to_thread``: the trace span goes along)."""
        ctx = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._pool, ctx.run, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)


async def side_thread(fn: Callable[..., T], *args: Any) -> T:
    """``asyncio.to_thread`` for torch work beside the steps (KV gathers for a transfer):
    on one torch thread, so it does not start a team that competes with the compute one's."""
    return await asyncio.to_thread(_single, fn, *args)


def _single(fn: Callable[..., T], *args: Any) -> T:
    _pin(1)
    return fn(*args)


def _pin(threads: int) -> None:
    """The calling thread's torch thread count, fixed (see the module's note)."""
    torch.get_num_threads()  # NOTE: the first read takes the shared count; ours comes after
    torch.set_num_threads(threads)
