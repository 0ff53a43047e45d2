"""A starting replica's state, before it answers any route.

From a ready peer when there is one (``index.snapshot``, answered by one of them): the
workers' load reports and the bookings, then each worker's prefix view. Without a peer
(the first replica, or all others gone) from the workers themselves: the load reports
that arrive within ``discover_s`` name them and each scheduler's snapshot fills its view.
KV events that arrive meanwhile wait in the prefix index (``WorkerView.pending``) and are
applied past each snapshot by sequence number; a view the peer lacks, or one with a gap
left after it, is taken from the worker's scheduler too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.messages import IndexSnapshot, IndexSnapshotRequest

from .prefix_index import PrefixIndex
from .registry import Registry
from .replicas import apply_state

log = logging.getLogger("cache_index.warmup")

DISCOVER_S = 1.0  # two load report intervals (scheduler/session.py LOAD_INTERVAL_S)
ASK_TIMEOUT_S = 2.0
ASK_ATTEMPTS = 2  # a peer silent this often: build from the workers instead


class Warmup:
    def __init__(self, bus: Bus, subjects: Subjects, registry: Registry, index: PrefixIndex,
                 from_scheduler: Callable[[str], Awaitable[None]], discover_s: float = DISCOVER_S) -> None:
        self.bus, self.subjects = bus, subjects
        self.registry, self.index = registry, index
        self.from_scheduler = from_scheduler  # fills a worker's view from its scheduler
        self.discover_s = discover_s

    async def run(self) -> str:
        """Load the state; returns where it came from (for logs and the Pong)."""
        state = await self._ask(IndexSnapshotRequest())
        if state is None:
            await asyncio.sleep(self.discover_s)  # NOTE: no peer: the load reports name the workers
            source = "workers"
        else:
            views = apply_state(self.registry, state)
            await asyncio.gather(*(self._view(w) for w in views))
            source = f"replica {state.replica}"
        stale = {s.report.worker_id for s in self.registry.live()} | set(self.index.views)
        stale = [w for w in sorted(stale) if self.index.needs_snapshot(w)]
        await asyncio.gather(*(self.from_scheduler(w) for w in stale))
        log.info("state from %s: %d workers, %d views from their schedulers",
                 source, len(self.registry.live()), len(stale))
        return source

    async def _view(self, worker_id: str) -> None:
        reply = await self._ask(IndexSnapshotRequest(worker=worker_id))
        for snap in reply.views if reply is not None else ():
            self.index.on_snapshot(snap)  # NOTE: replays the events buffered since, by seq

    async def _ask(self, req: IndexSnapshotRequest) -> IndexSnapshot | None:
        """A ready peer's answer; None when there is none (or none answers)."""
        for _ in range(ASK_ATTEMPTS):
            try:
                return await self.bus.request(self.subjects.index_snapshot(), req, IndexSnapshot,
                                              timeout=ASK_TIMEOUT_S)
            except ServiceError as exc:
                if exc.code != "timeout":  # NOTE: no responders: no replica is ready
                    return None
                log.warning("no snapshot from a peer within %.1fs (%s)", ASK_TIMEOUT_S, req.worker)
        return None
