"""Which asyncio event loop a service process runs on: uvloop where installed.

Every message a service handles costs an event-loop wake-up, socket reads and writes and
a few callbacks; on a machine whose cores the worker's compute threads also use, that CPU
comes out of the steps. uvloop (libuv, as vLLM's and SGLang's servers use) runs the same
asyncio API for less: over 200-step decode runs on 2 cores the gateway, tokenizer, scheduler,
cache index and broker used 6-12% less CPU per step at batch 8 and 32 with it (none less at
batch 1; PERFORMANCE-HISTORY.md, 2026-12-06, "the stack beside its runner").
``RADIXMESH_EVENT_LOOP=asyncio`` keeps the standard loop (e.g. to compare, or to debug).
``RADIXMESH_PROFILE_DIR=DIR`` runs the process under cProfile and writes
``DIR/<process name>-<pid>.prof`` when it exits (``python -m pstats`` reads it); its clock is
the thread's CPU time, so a call preempted inside a syscall is not counted busy.
"""

from __future__ import annotations

import asyncio
import os
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")
ENV = "RADIXMESH_EVENT_LOOP"
PROFILE_ENV = "RADIXMESH_PROFILE_DIR"
CHOICES = ("auto", "uvloop", "asyncio")  # auto: uvloop if it imports


def loop_factory(choice: str | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory for ``asyncio.Runner`` (None: asyncio's own loop)."""
    choice = (choice if choice is not None else os.environ.get(ENV, "")) or "auto"
    if choice not in CHOICES:
        raise SystemExit(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SystemExit(f"{ENV}=uvloop, but uvloop is not installed (pip install uvloop)") from None
        return None
    return uvloop.new_event_loop


def run(main: Awaitable[T], choice: str | None = None) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` picks."""
    profile_dir = os.environ.get(PROFILE_ENV)
    if not profile_dir:
        with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
            return runner.run(main)
    import cProfile
    import sys
    import time
    from pathlib import Path

    profiler = cProfile.Profile(time.thread_time)
    try:
        with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
            return profiler.runcall(runner.run, main)
    finally:
        name = Path(sys.argv[0]).parent.name if sys.argv[0].endswith("__main__.py") else Path(sys.argv[0]).stem
        Path(profile_dir).mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(Path(profile_dir) / f"{name}-{os.getpid()}.prof")
