"""Cache-index replicas as real processes on a real nats-server, fed by played workers
(load reports, KV events, snapshots on request: what the index reads of a scheduler).

One fleet for the module: replica A starts with no peer (state from the workers), B
starts after events were published and while more arrive (state from A), C joins to be
killed. No model: the index needs messages only."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from libs.protocol import Bus, Subjects, codec
from libs.protocol.hashing import block_hashes
from libs.protocol.messages import (
    EncodeReply, IndexBooking, KVEvent, KVEventBatch, KVSnapshot, LoadReport, ReleaseRequest,
    RouteReply, RouteRequest, SnapshotRequest,
)
from radixmesh import health
from services.gateway.config import PipelineConfig
from services.gateway.placement import Placement
from services.gateway.request import GenerationRequest

pytestmark = pytest.mark.slow  # starts real service processes

ROOT = Path(__file__).resolve().parents[2]
WORKERS = [f"w{i}" for i in range(4)]
PAGE = 16


def doc(i: int, n: int = 96) -> list[int]:
    return list(range(i * 1000, i * 1000 + n))


@dataclass
class PlayedWorkers:
    """Four schedulers as the index sees them; worker wi runs i requests (no ties)."""

    bus: Bus
    s: Subjects
    seq: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WORKERS, 0))
    blocks: dict[str, list[int]] = field(default_factory=lambda: {w: [] for w in WORKERS})
    snapshots: int = 0  # snapshot requests answered
    reporting: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> asyncio.Task:
        for w in WORKERS:
            await self.bus.subscribe(self.s.sched_snapshot(w), self._snapshot(w), SnapshotRequest)
        self.reporting.set()
        return asyncio.create_task(self._report())

    def _snapshot(self, w: str):
        async def answer(_: SnapshotRequest) -> KVSnapshot:
            self.snapshots += 1
            return KVSnapshot(worker_id=w, epoch=1, seq=self.seq[w], page_size=PAGE,
                              block_hashes=list(self.blocks[w]))
        return answer

    async def _report(self) -> None:
        while True:
            await self.reporting.wait()
            for i, w in enumerate(WORKERS):
                await self.bus.publish(self.s.index_load(w), LoadReport(
                    worker_id=w, scheduler_id="s", model="m", running=i, waiting=0,
                    free_slots=10_000, total_slots=10_000, max_model_len=4096, ts=time.time()))
            await asyncio.sleep(0.3)

    async def store(self, w: str, tokens: list[int]) -> None:
        hashes = block_hashes(tokens, PAGE)
        self.blocks[w] += hashes
        await self.bus.publish(self.s.index_events(w), KVEventBatch(
            worker_id=w, epoch=1, seq=self.seq[w], page_size=PAGE, ts=time.time(),
            events=[KVEvent(kind="stored", namespace="", block_hashes=hashes)]))
        self.seq[w] += 1


@dataclass
class Fleet:
    bus: Bus
    s: Subjects
    url: str
    workers: PlayedWorkers
    procs: dict[str, subprocess.Popen]
    logs: Path
    a: str = ""  # the replicas' instance ids
    b: str = ""
    b_started: float = 0.0
    late_events: asyncio.Task | None = None

    def spawn(self, name: str) -> str:
        instance = f"ci-{name}-{uuid.uuid4().hex[:4]}"
        cmd = [sys.executable, "-m", "services.cache_index", "--nats-url", self.url,
               "--subject-prefix", self.s.prefix, "--instance", instance,
               "--liveness-s", "30", "--kv-store-bucket", ""]
        with open(self.logs / f"{name}.log", "w") as log:
            self.procs[instance] = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                                    env=dict(os.environ, PYTHONUNBUFFERED="1"))
        return instance

    async def ready(self, instance: str, timeout: float = 30.0) -> float:
        """Seconds until ``instance`` says it is ready (radixmesh.health's check)."""
        start = time.monotonic()
        while True:
            try:
                await health.check_ping(self.url, self.s.ping("cache_index"), instance, 1.0)
                return time.monotonic() - start
            except health.Unhealthy:
                assert self.procs[instance].poll() is None, f"{instance} exited"
                assert time.monotonic() - start < timeout, f"{instance} not ready"
                await asyncio.sleep(0.05)

    async def route(self, subject: str, rid: str, tokens: list[int], dry_run=False) -> str:
        req = RouteRequest(rid=rid, model="m", num_tokens=len(tokens), input_ids=tokens, dry_run=dry_run)
        return (await self.bus.request(subject, req, RouteReply, 2.0)).worker_id


@pytest.fixture(scope="module")
async def fleet(nats_server, tmp_path_factory):
    s = Subjects("t" + uuid.uuid4().hex[:10])
    bus = await Bus.connect(nats_server.url, "played-workers")
    workers = PlayedWorkers(bus, s)
    reports = await workers.start()
    f = Fleet(bus, s, nats_server.url, workers, {}, tmp_path_factory.mktemp("replicas"))
    try:
        for i in range(12):  # before any replica: A gets these from the schedulers' snapshots
            await workers.store(WORKERS[i % 4], doc(i))
        f.a = f.spawn("a")
        await f.ready(f.a)
        assert workers.snapshots == len(WORKERS)
        for i in range(12, 24):  # A follows these as events
            await workers.store(WORKERS[i % 4], doc(i))
        await bus.nc.flush()
        f.b_started = time.monotonic()
        f.b = f.spawn("b")
        f.late_events = asyncio.create_task(publish_while_b_starts(workers))
        yield f
    finally:
        reports.cancel()
        for proc in f.procs.values():
            proc.terminate()
        for proc in f.procs.values():
            proc.wait(10)
        await bus.close()


async def publish_while_b_starts(workers: PlayedWorkers) -> None:
    for i in range(24, 64):  # B buffers these while it loads, or follows them once ready
        await workers.store(WORKERS[i % 4], doc(i))
        await asyncio.sleep(0.03)


async def test_a_replica_started_late_routes_as_the_warm_one(fleet):
    await fleet.ready(fleet.b)
    took = time.monotonic() - fleet.b_started
    assert took < 10.0, f"B was ready {took:.1f}s after it was started"
    assert fleet.workers.snapshots == len(WORKERS)  # its state came from A, not the schedulers
    await fleet.late_events
    await asyncio.sleep(0.3)
    prompts = [doc(i) + [7, 7] for i in range(64)] + [doc(100 + i) for i in range(16)]
    a, b = (fleet.s.index_replica_route(r) for r in (fleet.a, fleet.b))
    same = [await fleet.route(a, f"p{i}", p, dry_run=True) == await fleet.route(b, f"p{i}", p, dry_run=True)
            for i, p in enumerate(prompts)]
    assert sum(same) >= 0.95 * len(prompts), f"{sum(same)} of {len(prompts)} decisions agree"


async def test_each_route_is_answered_by_exactly_one_replica(fleet):
    await fleet.ready(fleet.b)
    bookings: list[IndexBooking] = []

    async def booked(msg: IndexBooking) -> None:
        bookings.append(msg)

    await fleet.bus.subscribe(fleet.s.index_booking(), booked, IndexBooking)
    replies: dict[str, int] = {}

    async def on_reply(msg) -> None:
        replies[msg.subject] = replies.get(msg.subject, 0) + 1

    inbox = fleet.bus.nc.new_inbox()
    await fleet.bus.nc.subscribe(inbox + ".*", cb=on_reply)
    for i in range(40):
        req = RouteRequest(rid=f"once{i}", model="m", num_tokens=96, input_ids=doc(200 + i))
        await fleet.bus.nc.publish(fleet.s.index_route(), codec.encode(req), reply=f"{inbox}.{i}")
    await asyncio.sleep(1.0)
    assert sorted(replies.values()) == [1] * 40
    assert sorted(b.rid for b in bookings) == sorted(f"once{i}" for i in range(40))
    assert {b.replica for b in bookings} == {fleet.a, fleet.b}  # both served
    for b in bookings:
        await fleet.bus.publish(fleet.s.index_release(), ReleaseRequest(rid=b.rid, worker_id=b.worker_id))


async def test_bookings_through_one_replica_steer_the_other(fleet):
    """Eight new prompts alternately through A and B: each booking adds load where it went,
    so they cover the four workers twice (w0 first: it runs the fewest), as one replica
    would; replicas blind to each other's bookings would pick w0, w0, w1, w1, ..."""
    await fleet.ready(fleet.b)
    fleet.workers.reporting.clear()  # NOTE: a report would count the bookings as reported
    await asyncio.sleep(0.5)
    try:
        subjects = [fleet.s.index_replica_route(r) for r in (fleet.a, fleet.b)]
        picks = [await fleet.route(subjects[i % 2], f"burst{i}", doc(300 + i)) for i in range(8)]
    finally:
        fleet.workers.reporting.set()
    assert picks == WORKERS * 2


async def test_a_killed_replica_loses_no_route(fleet):
    c = fleet.spawn("c")
    await fleet.ready(c)
    placement = Placement(fleet.bus, fleet.s, "m", PipelineConfig(route_timeout=0.5), None,
                          lambda subject, msg: None)  # NOTE: no load view: a fallback would raise

    async def route(i: int) -> float:
        start = time.monotonic()
        enc = EncodeReply(input_ids=doc(400 + i), max_new_tokens=8, detok_instance="t", max_model_len=4096)
        await placement.route(f"k{i}", GenerationRequest(input_ids=enc.input_ids), enc, [])
        return time.monotonic() - start

    async def burst() -> list[asyncio.Task]:
        tasks = []
        for i in range(120):
            tasks.append(asyncio.create_task(route(i)))
            await asyncio.sleep(0.01)
        return tasks

    launching = asyncio.create_task(burst())
    await asyncio.sleep(0.3)
    # C freezes holding the routes it is handed, then dies; NOTE: within route_timeout,
    # so each of them is asked again once C's subscription is gone
    fleet.procs[c].send_signal(signal.SIGSTOP)
    await asyncio.sleep(0.25)
    fleet.procs[c].kill()
    tasks = await launching
    took = await asyncio.gather(*tasks, return_exceptions=True)
    lost = [t for t in took if isinstance(t, BaseException)]
    assert not lost, lost[:3]
    assert max(took) > 0.5  # some route was held by C and asked again
    assert fleet.procs[c].wait(5) == -signal.SIGKILL
