"""Live workers and their load, fed by the schedulers' LoadReports."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from libs.protocol.messages import LoadReport, WorkerSummary


@dataclass
class WorkerState:
    report: LoadReport
    seen: float
    bookings: dict[str, float] = field(default_factory=dict)  # rid -> expiry

    def inflight(self, now: float) -> int:
        return sum(1 for expiry in self.bookings.values() if expiry > now)


class Registry:
    """Workers seen within ``liveness_s``; a booking counts until released or expired."""

    def __init__(self, liveness_s: float = 3.0, booking_ttl_s: float = 2.0,
                 clock=time.monotonic) -> None:
        self.liveness_s = liveness_s
        self.booking_ttl_s = booking_ttl_s
        self.clock = clock
        self._workers: dict[str, WorkerState] = {}

    def update(self, report: LoadReport) -> None:
        state = self._workers.get(report.worker_id)
        if state is None:
            self._workers[report.worker_id] = WorkerState(report, self.clock())
        else:
            state.report, state.seen = report, self.clock()

    def live(self, model: str | None = None) -> list[WorkerState]:
        now = self.clock()
        for wid in [w for w, s in self._workers.items() if now - s.seen > self.liveness_s]:
            del self._workers[wid]
        return [s for s in self._workers.values() if model is None or s.report.model == model]

    def book(self, worker_id: str, rid: str) -> None:
        state = self._workers.get(worker_id)
        if state is not None:
            now = self.clock()
            state.bookings = {r: e for r, e in state.bookings.items() if e > now}
            state.bookings[rid] = now + self.booking_ttl_s

    def release(self, worker_id: str, rid: str) -> None:
        state = self._workers.get(worker_id)
        if state is not None:
            state.bookings.pop(rid, None)

    def summaries(self) -> list[WorkerSummary]:
        now = self.clock()
        return [
            WorkerSummary(
                worker_id=s.report.worker_id, scheduler_id=s.report.scheduler_id,
                model=s.report.model, running=s.report.running, waiting=s.report.waiting,
                free_slots=s.report.free_slots, total_slots=s.report.total_slots,
                inflight=s.inflight(now), age_s=now - s.seen,
            )
            for s in self.live()
        ]
