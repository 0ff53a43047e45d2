"""One adopted worker: its loop, lease renewal, load reports and subscriptions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec

from libs.protocol import Bus, Subjects
from libs.protocol.messages import (
    AbortRequest, ErrorInfo, FlushReply, FlushRequest, KVSnapshot, LeaseRenew, SnapshotRequest, LoadReport, SchedStats, SchedStatsRequest,
    SubmitReply, SubmitRequest, WorkerInfo,
)

from .batcher import Batcher, BatcherConfig
from .request import Req
from .worker_loop import WorkerLoop, WorkerLost

log = logging.getLogger("scheduler.session")

LOAD_INTERVAL_S = 0.5


class WorkerSession:
    def __init__(self, bus: Bus, subjects: Subjects, scheduler_id: str, info: WorkerInfo,
                 config: BatcherConfig, lease_s: float, forward_timeout: float) -> None:
        self.bus = bus
        self.subjects = subjects
        self.scheduler_id = scheduler_id
        self.info = info
        self.lease_s = lease_s
        self.loop = WorkerLoop(bus, subjects, Batcher(info, config), forward_timeout)
        self.last_seen = time.monotonic()
        self.closed = asyncio.Event()
        self._subs: list = []
        self._tasks: list[asyncio.Task] = []

    @property
    def worker_id(self) -> str:
        return self.info.worker_id

    async def start(self) -> None:
        s, w = self.subjects, self.worker_id
        self._subs = [
            await self.bus.subscribe(s.sched_submit(w), self._on_submit, SubmitRequest),
            await self.bus.subscribe(s.sched_abort(w), self._on_abort, AbortRequest),
            await self.bus.subscribe(s.sched_stats(w), self._on_stats, SchedStatsRequest),
            await self.bus.subscribe(s.sched_flush(w), self._on_flush, FlushRequest),
            await self.bus.subscribe(s.sched_snapshot(w), self._on_snapshot, SnapshotRequest),
        ]
        self._tasks = [
            asyncio.create_task(self._run_loop()),
            asyncio.create_task(self._renew_lease()),
            asyncio.create_task(self._report_load()),
        ]
        log.info("driving worker %s (%d KV slots)", w, self.info.kv_slots)

    async def close(self, reason: str) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        log.warning("releasing worker %s: %s", self.worker_id, reason)
        self.loop.stop()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        self.loop.fail_all(ErrorInfo(code="worker_lost", status=503,
                                     message=f"worker {self.worker_id} lost: {reason}"))
        await self.loop.flush()
        with contextlib.suppress(Exception):
            await self.bus.publish(self.subjects.index_load(self.worker_id),
                                   self._load_report(alive=False))

    # -- handlers -------------------------------------------------------------

    async def _on_submit(self, msg: SubmitRequest) -> SubmitReply:
        req = Req(rid=msg.rid, input_ids=msg.input_ids, sampling=msg.sampling,
                  detok_instance=msg.detok_instance, namespace=msg.cache_salt)
        return SubmitReply(queue_position=self.loop.submit(req))

    async def _on_abort(self, msg: AbortRequest) -> None:
        self.loop.abort(msg.rid, msg.reason)

    async def _on_stats(self, _: SchedStatsRequest) -> SchedStats:
        return msgspec.structs.replace(self.loop.batcher.stats(),
                                       worker_idle_fraction=self.loop.idle_fraction)

    async def _on_snapshot(self, _: SnapshotRequest) -> KVSnapshot:
        return self.loop.batcher.snapshot()

    async def _on_flush(self, _: FlushRequest) -> FlushReply:
        freed = self.loop.batcher.flush_cache()
        await self.loop.flush()  # the "cleared" event goes out now
        return FlushReply(worker_id=self.worker_id, freed_slots=freed)

    # -- background tasks ------------------------------------------------------

    async def _run_loop(self) -> None:
        try:
            await self.loop.run()
        except WorkerLost as exc:
            await self.close(f"step failed: {exc}")

    async def _renew_lease(self) -> None:
        subject = self.subjects.worker_lease(self.worker_id)
        while True:
            await self.bus.publish(subject, LeaseRenew(scheduler_id=self.scheduler_id))
            await asyncio.sleep(self.lease_s / 5)

    async def _report_load(self) -> None:
        subject = self.subjects.index_load(self.worker_id)
        while True:
            await self.bus.publish(subject, self._load_report())
            await asyncio.sleep(LOAD_INTERVAL_S)

    def _load_report(self, alive: bool = True) -> LoadReport:
        batcher = self.loop.batcher
        return LoadReport(
            worker_id=self.worker_id, scheduler_id=self.scheduler_id, model=self.info.model,
            running=len(batcher.running), waiting=len(batcher.waiting),
            free_slots=batcher.cache.available, total_slots=self.info.kv_slots,
            max_model_len=self.info.max_model_len, ts=time.time(),
            queued_prefill_tokens=batcher.queued_prefill_tokens(),
            prefill_tps=self.loop.prefill_tps, decode_step_s=self.loop.decode_step_s,
            alive=alive,
        )
