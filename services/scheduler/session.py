"""One adopted worker: its step driver, lease renewal, load reports and subscriptions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time

import msgspec
from opentelemetry import trace

from libs.protocol import Bus, ServiceError, Subjects, errors
from libs.protocol.messages import (
    AbortRequest, ErrorInfo, FetchPages, FetchReply, FlushReply, FlushRequest, KVReady, KVSnapshot, LeaseRenew, LoadReport,
    PrefillRequest, PrefillStatus, PrepareRegex, SchedStats, SchedStatsRequest, SnapshotRequest, StreamStatusReply,
    StreamStatusRequest, SubmitReply, SubmitRequest, WorkerInfo,
)

from . import metrics
from .config import CoreConfig
from .core import SchedulerCore
from .disagg import remote_eligible
from .disagg_bus import DisaggLink
from .intake import check_regex
from .request import Req
from .driver import StepDriver, WorkerLost

log = logging.getLogger("scheduler.session")
_tracer = trace.get_tracer("radixmesh.scheduler")

LOAD_INTERVAL_S = 0.5
RENEW_MAX_INTERVAL_S = 0.5


class WorkerSession:
    def __init__(self, bus: Bus, subjects: Subjects, scheduler_id: str, info: WorkerInfo,
                 config: CoreConfig, lease_s: float, forward_timeout: float) -> None:
        self.bus = bus
        self.subjects = subjects
        self.scheduler_id = scheduler_id
        self.info = info
        self.lease_s = lease_s
        self.driver = StepDriver(bus, subjects, SchedulerCore(info, config), forward_timeout)
        self.driver.fence = (scheduler_id, info.epoch)
        self.last_seen = time.monotonic()
        self.session = secrets.token_hex(6)  # names this adoption in replies and load reports
        self.link = DisaggLink(bus, subjects, self.driver, self.session)
        self.driver.on_flush = self.link.pump
        self.closed = asyncio.Event()
        self._subs: list = []
        self._tasks: list[asyncio.Task] = []
        self._fetches: set[asyncio.Task] = set()  # FetchPages in flight (the shared store)

    @property
    def worker_id(self) -> str:
        return self.info.worker_id

    async def start(self) -> None:
        s, w = self.subjects, self.worker_id
        self._subs = [
            await self.bus.subscribe(s.sched_submit(w), self._on_submit, SubmitRequest),
            await self.bus.subscribe(s.sched_abort(w), self._on_abort, AbortRequest),
            await self.bus.subscribe(s.sched_stats(w), self._on_stats, SchedStatsRequest),
            await self.bus.subscribe(s.sched_status(w), self._on_status, StreamStatusRequest),
            await self.bus.subscribe(s.sched_flush(w), self._on_flush, FlushRequest),
            await self.bus.subscribe(s.sched_snapshot(w), self._on_snapshot, SnapshotRequest),
            await self.bus.subscribe(s.sched_prefill(w), self.link.on_prefill, PrefillRequest),
            await self.bus.subscribe(s.sched_prefill_status(w), self.link.on_prefill_status, PrefillStatus),
            await self.bus.subscribe(s.sched_kv_ready(w), self.link.on_ready, KVReady),
        ]
        self._tasks = [
            asyncio.create_task(self.link.watch()),
            asyncio.create_task(self._drive()),
            asyncio.create_task(self._renew_lease()),
            asyncio.create_task(self._report_load()),
        ]
        log.info("driving worker %s (%d KV slots)", w, self.info.kv_slots)

    async def close(self, reason: str, code: str = "worker_lost") -> None:
        """Stop driving the worker; its requests end with ``code`` (``scheduler_lost``: the
        worker is fine, they may resume on it under another scheduler)."""
        if self.closed.is_set():
            return
        self.closed.set()
        log.warning("releasing worker %s: %s", self.worker_id, reason)
        self.driver.stop()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        self.driver.fail_all(ErrorInfo(code=code, status=503,
                                     message=f"worker {self.worker_id} released: {reason}"))
        self.link.close()
        metrics.forget_worker(self.worker_id, self.info.role, self.info.model)
        await self.driver.flush()
        if code == "scheduler_lost":  # NOTE: stopping on purpose: hand the worker back now
            with contextlib.suppress(Exception):
                await self.bus.request(self.subjects.worker_lease(self.worker_id),
                                       LeaseRenew(scheduler_id=self.scheduler_id, release=True),
                                       WorkerInfo, timeout=1.0)
        with contextlib.suppress(Exception):
            await self.bus.publish(self.subjects.index_load(self.worker_id),
                                   self._load_report(alive=False))

    # -- handlers -------------------------------------------------------------

    async def _on_submit(self, msg: SubmitRequest) -> SubmitReply:
        prompt, output = _split_resumed(msg, self.info.vocab_size)
        if msg.sampling.regex:  # NOTE: up to tens of ms once per pattern: off the step loop
            await asyncio.to_thread(check_regex, msg.sampling.regex)
        req = Req(rid=msg.rid, input_ids=prompt, sampling=msg.sampling,
                  detok_instance=msg.detok_instance, namespace=msg.cache_salt,
                  output_ids=output)
        if output and req.lp_next >= 0:  # logprobs of the replayed output went out already
            req.lp_next = max(req.lp_next, req.fill_len)
        if msg.prefill_worker and msg.prefill_worker != self.worker_id and remote_eligible(req) \
                and self._uncached(req) >= self.driver.core.config.remote_prefill_min_tokens:
            self.link.attach(req, msg.prefill_worker, msg.prefill_predicted_s)
        position = self.driver.submit(req)
        if req.transfer is not None:
            self.link.pump()
        store = self.driver.core.store
        if store is not None and req.rid in store.fetching:
            task = asyncio.create_task(self._fetch(req, store.fetching[req.rid][1]))
            self._fetches.add(task)
            task.add_done_callback(self._fetches.discard)
        if req.sampling.regex:  # NOTE: the worker compiles it while the request queues
            await self._announce_pattern(req.sampling.regex)
        return SubmitReply(queue_position=position, session=self.session)

    def _uncached(self, req: Req) -> int:
        return req.prompt_len - self.driver.core.cache.reusable_len(req)

    async def _fetch(self, req: Req, fetch) -> None:
        """Ask the worker for the request's pages from the shared store (store_tier.py)."""
        msg = FetchPages(keys=fetch.keys, host_slots=fetch.slots.tolist(), deadline_s=fetch.deadline_s)
        with _tracer.start_as_current_span("scheduler.store_fetch", attributes={
                "radixmesh.rid": req.rid, "radixmesh.store_pages": len(fetch.keys),
                "radixmesh.deadline_s": fetch.deadline_s}) as span:
            try:
                reply = await self.bus.request(self.subjects.worker_fetch(self.worker_id), msg,
                                               FetchReply, timeout=fetch.deadline_s + 1.0)
            except ServiceError as exc:
                reply = FetchReply(arrived=0, error=exc.code)
            store = self.driver.core.store
            if store is None or req.rid not in store.fetching:
                return  # NOTE: the worker was let go meanwhile; its books are reset
            tokens = self.driver.core.fetched(req, reply)
            span.set_attributes({"radixmesh.store_arrived": reply.arrived, "radixmesh.store_tokens": tokens,
                                 "radixmesh.store_bytes": reply.nbytes, "radixmesh.store_s": reply.seconds,
                                 "radixmesh.store_error": reply.error, "radixmesh.store_deadline": reply.deadline})
        self.driver.wake()

    async def _announce_pattern(self, pattern: str) -> None:
        try:
            await self.bus.publish(self.subjects.worker_prepare(self.worker_id),
                                   PrepareRegex(patterns=[pattern]))
        except Exception as exc:  # noqa: BLE001 - then the step compiles it
            log.info("pattern not announced to %s: %s", self.worker_id, exc)

    async def _on_abort(self, msg: AbortRequest) -> None:
        self.driver.abort(msg.rid, msg.reason)

    async def _on_stats(self, _: SchedStatsRequest) -> SchedStats:
        return msgspec.structs.replace(self.driver.core.stats(),
                                       worker_idle_fraction=self.driver.idle_fraction,
                                       worker_active_s=self.driver.active_s,
                                       worker_busy_s=self.driver.busy_s)

    async def _on_status(self, msg: StreamStatusRequest) -> StreamStatusReply:
        return StreamStatusReply(sent=[self.driver.core.sent(rid) for rid in msg.rids])

    async def _on_snapshot(self, _: SnapshotRequest) -> KVSnapshot:
        return self.driver.core.snapshot()

    async def _on_flush(self, _: FlushRequest) -> FlushReply:
        freed = self.driver.core.flush_cache()
        await self.driver.flush()  # the "cleared" event goes out now
        return FlushReply(worker_id=self.worker_id, freed_slots=freed)

    # -- background tasks ------------------------------------------------------

    async def _drive(self) -> None:
        try:
            await self.driver.run()
        except WorkerLost as exc:
            await self.close(f"step failed: {exc}")
        except Exception as exc:  # noqa: BLE001 - e.g. a publish while the broker is away
            log.exception("loop of worker %s failed", self.worker_id)
            await self.close(f"loop failed: {type(exc).__name__}: {exc}")

    async def _renew_lease(self) -> None:
        """Renew every ``lease_s / 5`` (at most 0.5 s) and watch the answer: no
        responder means the worker process is gone, a refusal that the lease
        lapsed; either way its requests fail now (and are resumed elsewhere)."""
        subject = self.subjects.worker_lease(self.worker_id)
        interval = min(self.lease_s / 5, RENEW_MAX_INTERVAL_S)
        gone = 0  # consecutive "no responders": one may be a broker reconnect
        while True:
            try:
                await self.bus.request(subject, LeaseRenew(scheduler_id=self.scheduler_id),
                                       WorkerInfo, timeout=max(interval, 0.5))
                self.last_seen, gone = time.monotonic(), 0
            except ServiceError as exc:
                gone = gone + 1 if exc.code == "service_unavailable" else 0
                if gone >= 2 or exc.code == "not_adopted":
                    await self.close(f"lease renewal failed: {exc.message}")
                    return
                log.info("lease renewal of %s: %s", self.worker_id, exc.message)
            except Exception as exc:  # noqa: BLE001 - e.g. the broker is reconnecting
                log.info("lease renewal of %s: %s", self.worker_id, exc)
            await asyncio.sleep(interval if not gone else 0.1)

    async def _report_load(self) -> None:
        subject = self.subjects.index_load(self.worker_id)
        while True:
            try:
                report = self._load_report()
                metrics.report_worker(self.worker_id, self.info.role, self.info.model, report.waiting,
                                      report.running)
                await self.bus.publish(subject, report)
            except Exception as exc:  # noqa: BLE001 - the broker may be away: next tick
                log.info("load report of %s not sent: %s", self.worker_id, exc)
            await asyncio.sleep(LOAD_INTERVAL_S)

    def _load_report(self, alive: bool = True) -> LoadReport:
        return self.driver.core.load_report(self.driver.rates, self.scheduler_id, time.time(),
                                            alive=alive, session=self.session)

def _split_resumed(msg: SubmitRequest, vocab_size: int) -> tuple[list[int], list[int]]:
    """(prompt, output so far) of a submission; a resumed one carries output."""
    n = msg.num_output_tokens
    if n == 0:
        return msg.input_ids, []
    if not 0 < n < len(msg.input_ids):
        raise errors.invalid_request(
            f"num_output_tokens must lie in [0, {len(msg.input_ids)}) (the prompt is not empty)")
    if n >= msg.sampling.max_new_tokens:
        raise errors.invalid_request("num_output_tokens must be below max_new_tokens")
    output = msg.input_ids[-n:]
    if min(output) < 0 or max(output) >= vocab_size:
        raise errors.invalid_request(f"token ids must lie in [0, {vocab_size})")
    return msg.input_ids[:-n], output
