"""Operator endpoints that act on every worker: POST /flush_cache (and the worker list)."""

from __future__ import annotations

import asyncio

import msgspec

from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.messages import FlushReply, FlushRequest, WorkersReply, WorkersRequest

from .errors import ApiError


class CacheAdmin:
    def __init__(self, bus: Bus, subjects: Subjects, timeout: float = 5.0) -> None:
        self.bus = bus
        self.subjects = subjects
        self.timeout = timeout

    async def workers(self) -> list[dict]:
        """The live workers as the cache index lists them."""
        reply = await self.bus.request(self.subjects.index_workers(), WorkersRequest(),
                                       WorkersReply, self.timeout)
        return [msgspec.structs.asdict(w) for w in reply.workers]

    async def flush(self) -> dict:
        """Empty every worker's prefix cache; 400 if any of them is serving requests."""
        workers = await self.bus.request(self.subjects.index_workers(), WorkersRequest(),
                                         WorkersReply, self.timeout)
        results = await asyncio.gather(*(
            self.bus.request(self.subjects.sched_flush(w.worker_id), FlushRequest(), FlushReply,
                             self.timeout)
            for w in workers.workers
        ), return_exceptions=True)
        refused = [f"{w.worker_id}: {r.message if isinstance(r, ServiceError) else r}"
                   for w, r in zip(workers.workers, results) if isinstance(r, BaseException)]
        if refused:
            raise ApiError(400, "cache not flushed on " + "; ".join(refused), code="flush_refused")
        return {"flushed": {r.worker_id: r.freed_slots for r in results}}
