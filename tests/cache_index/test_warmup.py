"""A starting replica's warm-up over a played bus: from a peer, or from the schedulers."""

from __future__ import annotations

from libs.protocol import Subjects, codec, errors
from libs.protocol.messages import IndexSnapshot, IndexSnapshotRequest, KVSnapshot
from services.cache_index import warmup
from services.cache_index.replicas import state_snapshot, view_snapshot
from services.cache_index.warmup import Warmup

from .test_registry import Clock, report
from .test_replicas import Replica, events, warm


class PlayedBus:
    """Answers ``index.snapshot`` as ``peer`` would (None: no replica ready; "silent": a
    peer that never answers)."""

    def __init__(self, peer: Replica | str | None) -> None:
        self.peer = peer
        self.asked: list[str] = []

    async def request(self, subject, msg: IndexSnapshotRequest, reply_type, timeout):
        self.asked.append(msg.worker)
        if self.peer is None:
            raise errors.unavailable(f"no service is listening on {subject}")
        if self.peer == "silent":
            raise errors.timeout(f"no reply on {subject}")
        p = self.peer
        reply = (view_snapshot(p.name, p.index, msg.worker) if msg.worker
                 else state_snapshot(p.name, p.registry, p.index))
        return codec.decode(codec.encode(reply), IndexSnapshot)


def starting(bus: PlayedBus, clock: Clock) -> tuple[Replica, Warmup, list[str]]:
    new = Replica("new", clock, workers=())
    fetched: list[str] = []

    async def from_scheduler(worker_id: str) -> None:
        fetched.append(worker_id)
        new.index.on_snapshot(KVSnapshot(worker_id=worker_id, epoch=1, seq=0, page_size=16,
                                         block_hashes=[]))

    return new, Warmup(bus, Subjects("t"), new.registry, new.index, from_scheduler, 0.0), fetched


async def test_without_a_peer_every_reporting_worker_is_asked_for_its_snapshot():
    new, w, fetched = starting(PlayedBus(None), Clock())
    for wid in ("a", "b"):
        new.registry.update(report(wid))  # the load reports that arrive meanwhile
    assert await w.run() == "workers"
    assert fetched == ["a", "b"] and not new.index.needs_snapshot("a")


async def test_a_peer_gives_the_state_and_each_view_the_scheduler_only_the_rest():
    clock = Clock()
    peer = warm(clock)
    bus = PlayedBus(peer)
    new, w, fetched = starting(bus, clock)
    new.index.on_events(events("z", 4, list(range(64))))  # a worker the peer has not seen
    assert await w.run() == "replica warm"
    assert bus.asked == ["", "a", "b", "c"] and fetched == ["z"]
    assert {s.report.worker_id for s in new.registry.live()} == {"a", "b", "c"}
    assert new.index.views["b"].blocks == peer.index.views["b"].blocks


async def test_a_silent_peer_is_asked_again_then_the_workers():
    bus = PlayedBus("silent")
    new, w, fetched = starting(bus, Clock())
    new.registry.update(report("a"))
    assert await w.run() == "workers"
    assert len(bus.asked) == warmup.ASK_ATTEMPTS and fetched == ["a"]
