"""Cache-index replicas without a broker: bookings one replica makes reach another's
routing; a replica started late copies a peer's state and routes as it does."""

from __future__ import annotations

from libs.protocol import codec
from libs.protocol.hashing import block_hashes
from libs.protocol.messages import (
    IndexBooking, IndexSnapshot, KVEvent, KVEventBatch, KVSnapshot, RouteRequest,
)
from services.cache_index.prefix_index import PrefixIndex
from services.cache_index.registry import Registry
from services.cache_index.replicas import (
    adopt_booking, apply_state, booking_message, state_snapshot, view_snapshot,
)
from services.cache_index.router import Router

from .test_registry import Clock, report

WORKERS = ("a", "b", "c")


class Replica:
    """One replica's books, sharing its bookings the way service.py publishes them."""

    def __init__(self, name: str, clock: Clock, workers=WORKERS) -> None:
        self.name = name
        self.registry = Registry(clock=clock)
        self.index = PrefixIndex()
        self.router = Router(self.registry, self.index, "cache_aware")
        for wid in workers:
            self.registry.update(report(wid))

    def route(self, rid: str, tokens: list[int], peers=(), dry_run=False) -> str:
        decision = self.router.route(RouteRequest(rid=rid, model="m", num_tokens=len(tokens),
                                                  input_ids=tokens, dry_run=dry_run))
        now = self.registry.clock()
        for worker, booking in decision.bookings:
            wire = codec.encode(booking_message(self.name, worker, rid, booking, now))
            for peer in peers:
                assert adopt_booking(peer.registry, codec.decode(wire, IndexBooking))
        return decision.chosen.worker_id


def doc(i: int, n: int = 160) -> list[int]:
    return list(range(i * 1000, i * 1000 + n))


def alternate(a: Replica, b: Replica, prompts: list[list[int]], share=True) -> list[str]:
    """Route prompt i through a (i even) or b (i odd), the other learning its bookings."""
    pairs = [(a, b), (b, a)]
    return [pairs[i % 2][0].route(f"r{i}", p, peers=[pairs[i % 2][1]] if share else [])
            for i, p in enumerate(prompts)]


def spread_evenly(picks: list[str]) -> bool:
    """Every window of three consecutive picks covers the three workers."""
    return all(sorted(picks[i:i + 3]) == list(WORKERS) for i in range(0, len(picks), 3))


def test_a_burst_spread_over_two_replicas_spreads_over_workers_like_one():
    clock = Clock()
    prompts = [doc(i) for i in range(12)]
    one = Replica("one", clock)
    assert spread_evenly([one.route(f"r{i}", p) for i, p in enumerate(prompts)])
    # each booking adds load where it went, whichever replica made it
    assert spread_evenly(alternate(Replica("a", clock), Replica("b", clock), prompts))


def test_a_burst_of_one_document_sticks_to_one_worker_across_replicas():
    clock = Clock()
    a, b = Replica("a", clock), Replica("b", clock)
    for d in range(4):
        picks = alternate(a, b, [doc(100 + d) + [i] for i in range(4)])
        assert len(set(picks)) == 1, picks


def test_a_peer_booking_expires_and_its_release_is_seen():
    clock = Clock()
    a, b = Replica("a", clock), Replica("b", clock)
    worker = a.route("r1", doc(1), peers=[b])
    (state,) = [s for s in b.registry.live() if s.report.worker_id == worker]
    assert state.inflight(clock()) == 1
    b.registry.release(worker, "r1")  # NOTE: every replica gets the gateway's ReleaseRequest
    assert state.inflight(clock()) == 0
    a.route("r2", doc(2), peers=[b])
    clock.t += b.registry.booking_ttl_s + 0.01  # a lost release: gone at the TTL
    assert all(s.inflight(clock()) == 0 for s in b.registry.live())


def test_a_dry_run_books_nothing():
    clock = Clock()
    a, b = Replica("a", clock), Replica("b", clock)
    for i in range(4):
        a.route(f"d{i}", doc(1), peers=[b], dry_run=True)
    assert a.registry.bookings() == [] == b.registry.bookings()


def events(worker: str, seq: int, tokens: list[int], kind="stored") -> KVEventBatch:
    return KVEventBatch(worker_id=worker, epoch=1, seq=seq, page_size=16, events=[
        KVEvent(kind=kind, namespace="", block_hashes=block_hashes(tokens, 16))])


def warm(clock: Clock) -> Replica:
    """A replica that has followed every worker's events: doc i cached on worker i % 3;
    the workers' loads differ, so no decision is a tie (ties are broken at random)."""
    r = Replica("warm", clock)
    for running, wid in enumerate(WORKERS):
        r.registry.update(report(wid, running=running))
        r.index.on_snapshot(KVSnapshot(worker_id=wid, epoch=1, seq=0, page_size=16, block_hashes=[]))
    for i in range(9):
        assert r.index.on_events(events(WORKERS[i % 3], i // 3, doc(i)))
    r.route("inflight", doc(20))
    return r


def copy_state(warm_replica: Replica, new: Replica) -> None:
    """What warmup.py does over the bus, here through the codec."""
    wire = codec.encode(state_snapshot(warm_replica.name, warm_replica.registry, warm_replica.index))
    for wid in apply_state(new.registry, codec.decode(wire, IndexSnapshot)):
        view = codec.encode(view_snapshot(warm_replica.name, warm_replica.index, wid))
        for snap in codec.decode(view, IndexSnapshot).views:
            new.index.on_snapshot(snap)


def test_a_new_replica_copies_a_peer_and_routes_as_it_does():
    clock = Clock()
    a = warm(clock)
    b = Replica("new", clock, workers=())
    # events that reach the new replica while it loads: one the snapshot already has
    # (seq 2 on worker a), and the next one, applied past the snapshot
    for batch in (events("a", 2, doc(6)), events("a", 3, doc(30))):
        assert not b.index.on_events(batch)  # buffered: no view yet
    a.index.on_events(events("a", 3, doc(30)))
    copy_state(a, b)
    assert not any(b.index.needs_snapshot(w) for w in WORKERS)
    assert b.index.views["a"].blocks == a.index.views["a"].blocks
    assert [(w, r) for w, r, _ in b.registry.bookings()] == [(w, r) for w, r, _ in a.registry.bookings()]
    prompts = [doc(i) + [1, 2] for i in (*range(9), 30, 40)]
    decide = [[r.route(f"p{i}", p, dry_run=True) for i, p in enumerate(prompts)] for r in (a, b)]
    assert decide[0] == decide[1]


def test_a_gap_after_the_peers_snapshot_leaves_the_view_to_the_scheduler():
    clock = Clock()
    a = warm(clock)
    b = Replica("new", clock, workers=())
    b.index.on_events(events("b", 5, doc(50)))  # the peer is behind: seq 3 and 4 never seen here
    copy_state(a, b)
    assert b.index.needs_snapshot("b") and not b.index.needs_snapshot("a")


def test_a_restored_worker_keeps_a_fresher_own_report():
    clock = Clock()
    reg = Registry(clock=clock)
    reg.update(report("a", running=3))
    reg.restore(report("a", running=9), age_s=1.0)
    reg.restore(report("b", running=1), age_s=1.0)
    seen = {s.report.worker_id: (s.report.running, clock() - s.seen) for s in reg.live()}
    assert seen == {"a": (3, 0.0), "b": (1, 1.0)}
