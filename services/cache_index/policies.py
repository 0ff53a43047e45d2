"""Routing policies: pick a worker for a request among the live ones."""

from __future__ import annotations

import random
from typing import Callable

from .registry import WorkerState

Policy = Callable[[list[WorkerState], int, float], WorkerState]


def least_load(workers: list[WorkerState], num_tokens: int, now: float) -> WorkerState:
    """Fewest requests (running + queued + booked), then most free KV slots."""

    def key(s: WorkerState) -> tuple[int, int, float]:
        r = s.report
        return (r.running + r.waiting + s.inflight(now), -r.free_slots, random.random())

    return min(workers, key=key)


def round_robin_factory() -> Policy:
    counter = 0

    def round_robin(workers: list[WorkerState], num_tokens: int, now: float) -> WorkerState:
        nonlocal counter
        ordered = sorted(workers, key=lambda s: s.report.worker_id)
        counter += 1
        return ordered[counter % len(ordered)]

    return round_robin


def random_choice(workers: list[WorkerState], num_tokens: int, now: float) -> WorkerState:
    return random.choice(workers)


POLICIES: dict[str, Callable[[], Policy]] = {
    "least_load": lambda: least_load,
    "round_robin": round_robin_factory,
    "random": lambda: random_choice,
}
