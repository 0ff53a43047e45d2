"""Live workers and their load, fed by the schedulers' LoadReports, plus bookings:
requests routed to a worker whose load and prefix its reports do not show yet."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from libs.protocol.limits import WORKER_LIVENESS_S
from libs.protocol.messages import LoadReport, WorkerSummary


REPORT_GRACE_S = 0.1  # a report received this long after a booking already counts it
# a released booking's pages still count as cached this long: the request's KV events
# can reach the index after its release (a fork's held prefix, then its branches)
RELEASE_GRACE_S = 1.0


@dataclass
class Booking:
    created: float
    expiry: float
    tokens: int  # prefill tokens the request adds to the worker's queue
    hashes: frozenset[int]  # its pages: soon cached on that worker
    released: bool = False  # finished: no load any more, its pages only until expiry


@dataclass
class WorkerState:
    report: LoadReport
    seen: float
    bookings: dict[str, Booking] = field(default_factory=dict)

    def live_bookings(self, now: float) -> list[Booking]:
        """Bookings whose pages may not be in the index yet (until released or expired)."""
        return [b for b in self.bookings.values() if b.expiry > now]

    def unreported(self, now: float) -> list[Booking]:
        """Bookings the last load report cannot include yet (so they add load)."""
        return [b for b in self.live_bookings(now)
                if not b.released and b.created > self.seen - REPORT_GRACE_S]

    def inflight(self, now: float) -> int:
        return len(self.unreported(now))

    def load(self, now: float) -> int:
        return self.report.running + self.report.waiting + self.inflight(now)


class Registry:
    """Workers seen within ``liveness_s``; a booking counts until released or expired."""

    def __init__(self, liveness_s: float = WORKER_LIVENESS_S, booking_ttl_s: float = 2.0,
                 clock=time.monotonic) -> None:
        self.liveness_s = liveness_s
        self.booking_ttl_s = booking_ttl_s
        self.clock = clock
        self._workers: dict[str, WorkerState] = {}

    def update(self, report: LoadReport) -> bool:
        """Record a report; True when the worker is new to the registry."""
        if not report.alive:
            self._workers.pop(report.worker_id, None)
            return False
        state = self._workers.get(report.worker_id)
        if state is None:
            self._workers[report.worker_id] = WorkerState(report, self.clock())
            return True
        state.report, state.seen = report, self.clock()
        return False

    def live(self, model: str | None = None) -> list[WorkerState]:
        now = self.clock()
        for wid in [w for w, s in self._workers.items() if now - s.seen > self.liveness_s]:
            del self._workers[wid]
        return [s for s in self._workers.values() if model is None or s.report.model == model]

    def book(self, worker_id: str, rid: str, tokens: int = 0,
             hashes: frozenset[int] = frozenset()) -> Booking | None:
        """Book ``rid`` on the worker for ``booking_ttl_s``; None if the worker is unknown."""
        now = self.clock()
        return self.add(worker_id, rid, Booking(now, now + self.booking_ttl_s, tokens, hashes))

    def add(self, worker_id: str, rid: str, booking: Booking) -> Booking | None:
        """Count ``booking`` (this replica's, or one a peer made) on a known worker."""
        state = self._workers.get(worker_id)
        if state is None:
            return None
        now = self.clock()
        state.bookings = {r: b for r, b in state.bookings.items() if b.expiry > now}
        state.bookings[rid] = booking
        return booking

    def release(self, worker_id: str, rid: str) -> None:
        """The request finished or failed: it adds no load; its pages count as cached
        for ``RELEASE_GRACE_S`` more, until the worker's KV events have caught up."""
        state = self._workers.get(worker_id)
        booking = state.bookings.get(rid) if state is not None else None
        if booking is not None:
            booking.released = True
            booking.expiry = min(booking.expiry, self.clock() + RELEASE_GRACE_S)

    def restore(self, report: LoadReport, age_s: float) -> None:
        """A worker as a peer replica saw it, its last report ``age_s`` old; a report
        received here already is at least as fresh and stays."""
        if report.worker_id not in self._workers and report.alive:
            self._workers[report.worker_id] = WorkerState(report, self.clock() - age_s)

    def bookings(self) -> list[tuple[str, str, Booking]]:
        """(worker, rid, booking) of every booking still counted."""
        now = self.clock()
        return [(s.report.worker_id, rid, b) for s in self.live()
                for rid, b in s.bookings.items() if b.expiry > now]

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
