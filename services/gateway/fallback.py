"""The gateway's own view of worker load: for routing when the cache index is
down, and for noticing that a request's scheduler is gone (it died, or a new
scheduler session drives the worker) so the request can resume elsewhere."""

from __future__ import annotations

import logging
import time

from libs.protocol import Bus, Subjects
from libs.protocol.limits import WORKER_LIVENESS_S
from libs.protocol.messages import LoadReport

log = logging.getLogger("radixmesh.gateway.fallback")


class LoadView:
    """Latest LoadReport per worker (the same reports the cache index reads)."""

    def __init__(self, liveness_s: float = WORKER_LIVENESS_S, clock=time.monotonic,
                 stale_s: float = 5.0) -> None:
        self.liveness_s = liveness_s
        self.stale_s = stale_s
        self.clock = clock
        self._reports: dict[str, tuple[LoadReport, float]] = {}
        self._heard: dict[str, tuple[str, float]] = {}  # worker -> (model, last report of any kind)
        self.fallback_routes = 0

    async def start(self, bus: Bus, subjects: Subjects) -> None:
        await bus.subscribe(subjects.index_load_all(), self._on_load, LoadReport)

    async def _on_load(self, report: LoadReport) -> None:
        self._heard[report.worker_id] = (report.model, self.clock())
        if report.alive:
            self._reports[report.worker_id] = (report, self.clock())
        else:
            self._reports.pop(report.worker_id, None)

    def lost(self, worker_id: str, session: str, since: float) -> str | None:
        """Why a request submitted to ``session`` on ``worker_id`` at ``since``
        (this view's clock) can no longer finish there, or None.

        NOTE: only reports heard after ``since`` count, so a report of an older
        session that was still on its way cannot fail a newer request.
        """
        entry = self._reports.get(worker_id)
        if entry is None or not session:
            return None
        report, seen = entry
        now = self.clock()
        if seen > since and report.session and report.session != session:
            return f"worker {worker_id} is driven by a new scheduler session"
        if now - max(seen, since) > self.stale_s:
            return f"no load report from worker {worker_id} for {now - seen:.1f}s"
        return None

    def heard_within(self, model: str, seconds: float) -> bool:
        """Whether a worker of ``model`` reported (alive or leaving) within ``seconds``: one
        that is restarting or between schedulers, not a model nobody serves."""
        now = self.clock()
        return any(m == model and now - t <= seconds for m, t in self._heard.values())

    def live(self) -> list[LoadReport]:
        """The latest report of every worker heard from within ``liveness_s``."""
        now = self.clock()
        return [r for r, seen in self._reports.values() if now - seen <= self.liveness_s]

    def pick(self, model: str, exclude: list[str]) -> str | None:
        """Least-loaded live worker for ``model``, or None if none is known."""
        live = [r for r in self.live() if r.model == model and r.worker_id not in exclude]
        if not live:
            return None
        best = min(live, key=lambda r: (r.running + r.waiting, -r.free_slots))
        self.fallback_routes += 1
        return best.worker_id
