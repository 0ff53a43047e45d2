"""The scheduler process: adopts announced workers and drives each one."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import dataclass

from libs.protocol import ServiceError
from libs.protocol.limits import WORKER_LIVENESS_S
from libs.protocol.messages import AdoptRequest, WorkerInfo
from libs.protocol.service import ServiceContext

from .config import CoreConfig
from .session import WorkerSession

log = logging.getLogger("scheduler")


@dataclass(frozen=True)
class SchedulerConfig:
    core: CoreConfig
    max_workers: int = 0  # 0: adopt every free worker
    lease_s: float = 5.0
    liveness_s: float = WORKER_LIVENESS_S
    forward_timeout: float = 300.0
    # a free worker is adopted at once by a scheduler on its host that drives none yet; others
    # wait (so the local, then the least busy scheduler wins the race for it)
    foreign_delay_s: float = 2.0  # the worker is on another host
    busy_delay_s: float = 1.0  # per worker this scheduler already drives


class Adopter:
    """Adopts announced free workers and drives each through a WorkerSession."""

    def __init__(self, ctx: ServiceContext, config: SchedulerConfig) -> None:
        self.ctx = ctx
        self.config = config
        self.id = ctx.config.instance
        self.sessions: dict[str, WorkerSession] = {}
        self._adopting: set[str] = set()
        self._free_since: dict[str, float] = {}  # worker -> when first seen free
        self.host = socket.gethostname()

    async def start(self) -> None:
        await self.ctx.bus.subscribe(
            self.ctx.subjects.worker_announce(), self._on_announce, WorkerInfo, concurrent=True
        )
        task = asyncio.create_task(self._watch_liveness())
        self.ctx.stack.callback(task.cancel)
        self.ctx.stack.push_async_callback(self.close)

    async def close(self) -> None:
        for session in list(self.sessions.values()):
            await session.close("scheduler stopping", code="scheduler_lost")
        self.sessions.clear()

    async def _on_announce(self, info: WorkerInfo) -> None:
        session = self.sessions.get(info.worker_id)
        if info.leaving:
            self._free_since.pop(info.worker_id, None)
            if session is not None:
                await self._drop(session, "the worker is stopping")
            return
        if session is not None:
            session.last_seen = time.monotonic()
            if info.adopted_by != self.id:
                await self._drop(session, f"worker now adopted by {info.adopted_by}")
            return
        if info.adopted_by not in (None, self.id):
            self._free_since.pop(info.worker_id, None)
            return
        if info.worker_id in self._adopting or not self._my_turn(info):
            return
        if self.config.max_workers and len(self.sessions) >= self.config.max_workers:
            return
        self._adopting.add(info.worker_id)
        try:
            await self._adopt(info.worker_id)
        finally:
            self._adopting.discard(info.worker_id)

    def _my_turn(self, info: WorkerInfo) -> bool:
        """Whether this scheduler has waited its share for a free worker (see the delays)."""
        if info.adopted_by == self.id:
            return True
        now = time.monotonic()
        since = self._free_since.setdefault(info.worker_id, now)
        foreign = bool(info.host) and info.host != self.host
        wait = self.config.foreign_delay_s * foreign + self.config.busy_delay_s * len(self.sessions)
        return now - since >= wait

    async def _adopt(self, worker_id: str) -> None:
        request = AdoptRequest(scheduler_id=self.id, lease_s=self.config.lease_s)
        try:
            info = await self.ctx.bus.request(
                self.ctx.subjects.worker_adopt(worker_id), request, WorkerInfo, timeout=5.0
            )
        except ServiceError as exc:
            log.info("could not adopt %s: %s", worker_id, exc.message)
            return
        session = WorkerSession(
            self.ctx.bus, self.ctx.subjects, self.id, info, self.config.core,
            self.config.lease_s, self.config.forward_timeout,
        )
        self.sessions[worker_id] = session
        self._free_since.pop(worker_id, None)
        await session.start()
        self._update_detail()

    async def _drop(self, session: WorkerSession, reason: str) -> None:
        self.sessions.pop(session.worker_id, None)
        await session.close(reason)
        self._update_detail()

    async def _watch_liveness(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if session.closed.is_set():
                    self.sessions.pop(session.worker_id, None)
                    self._update_detail()
                elif now - session.last_seen > self.config.liveness_s:
                    await self._drop(session, "no announce for "
                                     f"{now - session.last_seen:.1f}s")

    def _update_detail(self) -> None:
        self.ctx.detail["workers"] = ",".join(sorted(self.sessions))
