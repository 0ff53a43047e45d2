"""Drive a workload against one system: arrivals, dependencies, concurrency.

Root requests (no parent) arrive by a Poisson process of ``rate`` requests/s
(all at once when ``rate`` is inf), unless a request fixes its own ``arrive_s``;
a request with parents (or ``after``) is released as soon as all of them
finished, with the parents' actual answers embedded. At most
``max_concurrency`` requests are in flight (None: unbounded).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

import numpy as np

from .record import Record
from .workload import RequestSpec, Workload

# send(spec, rendered messages, record, index) fills the record
Send = Callable[[RequestSpec, list[dict[str, str]], Record, int], Awaitable[None]]


class Progress(Protocol):
    """What the runners need of a progress bar (tqdm has both)."""

    def reset(self, total: int | None = None) -> object: ...

    def update(self, n: int = 1) -> object: ...


class NoProgress:
    def reset(self, total: int | None = None) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass


@dataclass(frozen=True)
class Load:
    rate: float = math.inf  # root requests per second (Poisson)
    max_concurrency: int | None = None
    seed: int = 0


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """Seconds after the start at which each of ``n`` roots arrives (the first at 0)."""
    if n == 0:
        return []
    if not math.isfinite(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError(f"request rate must be positive, got {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


def _arrivals(workload: Workload, load: Load) -> dict[str, float]:
    """Request id -> arrival time: a request's own ``arrive_s``, else the load's
    arrival process for the roots."""
    fixed = {s.id: s.arrive_s for s in workload.requests if s.arrive_s is not None}
    roots = [s.id for s in workload.roots if s.id not in fixed]
    return dict(zip(roots, arrival_times(len(roots), load.rate, load.seed))) | fixed


async def run_workload(workload: Workload, system: str, send: Send, load: Load,
                       progress: Progress | None = None) -> tuple[list[Record], float]:
    """Run every request once; returns (records in workload order, duration in seconds)."""
    progress = progress or NoProgress()
    arrival = _arrivals(workload, load)
    finished = {s.id: asyncio.Event() for s in workload.requests}
    answers: dict[str, str] = {}
    limit = asyncio.Semaphore(load.max_concurrency or len(workload.requests) or 1)
    progress.reset(len(workload.requests))
    t0 = time.perf_counter()

    async def one(index: int, spec: RequestSpec) -> Record:
        record = Record(system, spec.id, spec.kind, list(spec.depends_on))
        try:
            if spec.id in arrival:
                await asyncio.sleep(max(0.0, t0 + arrival[spec.id] - time.perf_counter()))
            for parent in (*spec.depends_on, *spec.after):
                await finished[parent].wait()
            failed = [p for p in spec.depends_on if p not in answers]
            if failed:
                record.error = f"not sent: parent(s) {failed} failed"
                return record
            async with limit:
                record.start_s = time.perf_counter() - t0
                await send(spec, spec.render(answers), record, index)
            if record.ok:
                answers[spec.id] = record.text
            return record
        finally:
            finished[spec.id].set()
            progress.update(1)

    records = await asyncio.gather(*(one(i, s) for i, s in enumerate(workload.requests)))
    return list(records), time.perf_counter() - t0
