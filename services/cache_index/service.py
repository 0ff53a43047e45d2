"""cache_index process: mirrors the workers' prefix caches and routes requests.

One of N active replicas: each consumes every KV event, load report, booking and
release; routes (and worker lists, snapshots) go to one replica of the queue group,
which it joins only once it holds the workers' state (warmup.py). Until then its
Pong says ``ready: false``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from opentelemetry import trace
from prometheus_client import Counter, Histogram

from libs.protocol import ServiceError
from libs.protocol.messages import (
    IndexBooking, IndexSnapshot, IndexSnapshotRequest, KVEventBatch, KVSnapshot, LoadReport,
    ReleaseRequest, RouteReply, RouteRequest, SnapshotRequest, WorkersReply, WorkersRequest,
)
from libs.protocol.service import ServiceContext
from libs.protocol.subjects import INDEX_QUEUE

from .policies import predict_ttft
from .prefix_index import PrefixIndex
from .registry import Registry
from .replicas import adopt_booking, booking_message, state_snapshot, view_snapshot
from .router import Decision, Router
from .store_pages import StorePages, watch_bucket
from .warmup import DISCOVER_S, Warmup

log = logging.getLogger("cache_index")
_tracer = trace.get_tracer("radixmesh.cache_index")

LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
KV_EVENT_LAG = Histogram("radixmesh:kv_event_lag_seconds",
                         "Scheduler publish -> applied here, per KV event batch (wall clocks)",
                         buckets=LAG_BUCKETS)
LOAD_REPORT_LAG = Histogram("radixmesh:load_report_lag_seconds",
                            "Scheduler publish -> handled here, per load report (wall clocks)",
                            buckets=LAG_BUCKETS)
KV_EVENTS = Counter("radixmesh:kv_events", "KV events received from schedulers")
RESYNCS = Counter("radixmesh:kv_index_resyncs", "Snapshots fetched to resync a worker's view")
PEER_BOOKINGS = Counter("radixmesh:index_peer_bookings", "Bookings learnt from other index replicas")


class CacheIndex:
    def __init__(self, ctx: ServiceContext, policy: str, registry: Registry,
                 store_bucket: str = "", local_prefill_factor: float = 0.0,
                 discover_s: float = DISCOVER_S) -> None:
        self.ctx = ctx
        self.registry = registry
        self.index = PrefixIndex()
        self.store_bucket = store_bucket
        self.store = StorePages() if store_bucket else None
        self.router = Router(registry, self.index, policy, self.store, local_prefill_factor)
        self._syncing: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self.loading = True  # NOTE: no resyncs meanwhile: the warm-up fetches what it lacks
        self.discover_s = discover_s  # with no peer: how long load reports name the workers

    @property
    def replica(self) -> str:
        return self.ctx.config.instance

    async def start(self) -> None:
        s, bus = self.ctx.subjects, self.ctx.bus
        self.ctx.detail.update(policy=self.router.policy_name, ready="false")
        await bus.subscribe(s.index_load_all(), self._on_load, LoadReport)
        await bus.subscribe(s.index_events_all(), self._on_events, KVEventBatch)
        await bus.subscribe(s.index_release(), self._on_release, ReleaseRequest)
        await bus.subscribe(s.index_booking(), self._on_booking, IndexBooking)
        if self.store is not None:  # NOTE: credits pages in the shared store when routing
            task = asyncio.create_task(watch_bucket(bus.nc, self.store_bucket, self.store))
            self.ctx.stack.callback(task.cancel)
        join = self._spawn(self._join())
        self.ctx.stack.callback(join.cancel)

    async def _join(self) -> None:
        """Load the workers' state, then answer routes (before: answer nothing)."""
        s, bus = self.ctx.subjects, self.ctx.bus
        try:
            warmup = Warmup(bus, s, self.registry, self.index, self._fetch_snapshot, self.discover_s)
            source = await warmup.run()
            self.loading = False
            await bus.subscribe(s.index_route(), self._on_route, RouteRequest, queue=INDEX_QUEUE)
            await bus.subscribe(s.index_workers(), self._on_workers, WorkersRequest, queue=INDEX_QUEUE)
            await bus.subscribe(s.index_snapshot(), self._on_snapshot, IndexSnapshotRequest,
                                queue=INDEX_QUEUE)
            await bus.subscribe(s.index_replica_route(self.replica), self._on_route, RouteRequest)
        except Exception:  # noqa: BLE001 - a replica that cannot join is restarted
            log.exception("cache index %s could not load its state; stopping", self.replica)
            self.ctx.stop.set()
            return
        self.ctx.detail.update(ready="true", state_from=source)
        log.info("cache index %s ready (state from %s)", self.replica, source)

    async def _on_load(self, report: LoadReport) -> None:
        LOAD_REPORT_LAG.observe(max(0.0, time.time() - report.ts))
        before = {s.report.worker_id for s in self.registry.live()}
        self.registry.update(report)
        after = {s.report.worker_id for s in self.registry.live()}
        for gone in before - after:
            self.index.drop(gone)
        if self.index.needs_snapshot(report.worker_id):
            self._resync(report.worker_id)
        self.ctx.detail["workers"] = str(len(after))

    async def _on_events(self, batch: KVEventBatch) -> None:
        KV_EVENTS.inc(len(batch.events))
        if not self.index.on_events(batch):
            self._resync(batch.worker_id)
            return
        sent = getattr(batch, "ts", 0.0)  # NOTE: wall clock at publish, when the scheduler sets it
        if sent:
            KV_EVENT_LAG.observe(max(0.0, time.time() - sent))

    async def _on_route(self, req: RouteRequest) -> RouteReply:
        with _tracer.start_as_current_span("cache_index.route") as span:
            decision = self.router.route(req)
            if span.is_recording():
                span.set_attributes(decision.attributes(self.router.policy_name))
                span.set_attributes({"radixmesh.rid": req.rid, "radixmesh.prompt_tokens": req.num_tokens})
        await self._share(req.rid, decision)
        prefill = decision.prefill
        return RouteReply(worker_id=decision.chosen.worker_id, policy=self.router.policy_name,
                          predicted_ttft_s=predict_ttft(prefill or decision.chosen, req.num_tokens),
                          prefill_worker=prefill.worker_id if prefill else "",
                          prefill_predicted_s=predict_ttft(prefill, req.num_tokens) if prefill else 0.0)

    async def _share(self, rid: str, decision: Decision) -> None:
        """Tell the other replicas what this route booked. NOTE: published before the
        reply, so a peer has the booking before the gateway can send its release."""
        now = self.registry.clock()
        for worker_id, booking in decision.bookings:
            await self.ctx.bus.publish(self.ctx.subjects.index_booking(),
                                       booking_message(self.replica, worker_id, rid, booking, now))

    async def _on_booking(self, msg: IndexBooking) -> None:
        if msg.replica != self.replica and adopt_booking(self.registry, msg):
            PEER_BOOKINGS.inc()

    async def _on_release(self, msg: ReleaseRequest) -> None:
        self.registry.release(msg.worker_id, msg.rid)

    async def _on_snapshot(self, req: IndexSnapshotRequest) -> IndexSnapshot:
        if req.worker:
            return view_snapshot(self.replica, self.index, req.worker)
        return state_snapshot(self.replica, self.registry, self.index)

    async def _on_workers(self, _: WorkersRequest) -> WorkersReply:
        return WorkersReply(workers=self.registry.summaries())

    def _resync(self, worker_id: str) -> None:
        if not self.loading and worker_id not in self._syncing:
            self._spawn(self._fetch_snapshot(worker_id))

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _fetch_snapshot(self, worker_id: str) -> None:
        """The worker's view from its scheduler's snapshot (plus the events buffered since)."""
        if worker_id in self._syncing:
            return
        self._syncing.add(worker_id)
        try:
            snap = await self.ctx.bus.request(self.ctx.subjects.sched_snapshot(worker_id),
                                              SnapshotRequest(), KVSnapshot, timeout=5.0)
            self.index.on_snapshot(snap)
            RESYNCS.inc()
            log.info("resynced %s: %d blocks (epoch %d)", worker_id, len(snap.block_hashes),
                     snap.epoch)
        except ServiceError as exc:
            log.warning("snapshot of %s failed: %s", worker_id, exc.message)
        finally:
            self._syncing.discard(worker_id)
