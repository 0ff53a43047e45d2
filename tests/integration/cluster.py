"""A running stack's workers as the tests see them: who is routable, their stats, their process."""

from __future__ import annotations

import asyncio
import time

from libs.protocol import Bus, Subjects
from libs.protocol.messages import SchedStats, SchedStatsRequest, WorkersReply, WorkersRequest
from radixmesh.launcher import LocalStack


class Cluster:
    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        self.subjects = Subjects(stack.config.subject_prefix)

    async def _bus(self) -> Bus:
        return await Bus.connect(self.stack.nats_url, "test-cluster")

    async def workers(self) -> list[str]:
        """The workers the cache index routes to."""
        bus = await self._bus()
        try:
            reply = await bus.request(self.subjects.index_workers(), WorkersRequest(), WorkersReply)
            return sorted(w.worker_id for w in reply.workers)
        finally:
            await bus.close()

    async def stats(self, worker_id: str, timeout: float = 2.0) -> SchedStats:
        bus = await self._bus()
        try:
            return await bus.request(self.subjects.sched_stats(worker_id), SchedStatsRequest(),
                                     SchedStats, timeout=timeout)
        finally:
            await bus.close()

    async def finished(self) -> dict[str, int]:
        """Requests finished so far, per routable worker."""
        return {wid: (await self.stats(wid)).requests_finished for wid in await self.workers()}

    async def wait_for_workers(self, n: int, timeout: float = 90) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            workers = await self.workers()
            if len(workers) == n:
                return workers
            await asyncio.sleep(0.2)
        raise AssertionError(f"expected {n} workers, have {await self.workers()}")

    def worker_proc(self, worker_id: str) -> str:
        """The launcher's name for the process that runs ``worker_id``."""
        return next(p.name for p in self.stack.procs if worker_id in p.cmd)
