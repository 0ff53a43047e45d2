"""What cache-index replicas tell each other, as messages, and applying them here.

Every replica consumes every KV event and load report itself; what only one replica
sees is a routing decision (the queue group hands each route to one), so the one that
routed publishes its bookings. A starting replica copies a ready one's state: the
workers' reports and the bookings, then each worker's prefix view as a ``KVSnapshot``
whose (epoch, seq) says which buffered KV events follow it. No broker here.
"""

from __future__ import annotations

from libs.protocol.messages import IndexBooking, IndexSnapshot, IndexWorker, KVSnapshot

from .prefix_index import PrefixIndex
from .registry import Booking, Registry


def booking_message(replica: str, worker_id: str, rid: str, booking: Booking,
                    now: float) -> IndexBooking:
    return IndexBooking(replica=replica, rid=rid, worker_id=worker_id, tokens=booking.tokens,
                        hashes=sorted(booking.hashes), ttl_s=max(0.0, booking.expiry - now),
                        age_s=max(0.0, now - booking.created), released=booking.released)


def adopt_booking(registry: Registry, msg: IndexBooking) -> bool:
    """Count a peer's booking here, its clock moved onto ours; False: unknown worker."""
    now = registry.clock()
    booking = Booking(created=now - msg.age_s, expiry=now + msg.ttl_s, tokens=msg.tokens,
                      hashes=frozenset(msg.hashes), released=msg.released)
    return registry.add(msg.worker_id, msg.rid, booking) is not None


def state_snapshot(replica: str, registry: Registry, index: PrefixIndex) -> IndexSnapshot:
    """Every live worker (report, age, whether its view is complete) and every booking."""
    now = registry.clock()
    workers = [IndexWorker(report=s.report, age_s=now - s.seen,
                           synced=not index.needs_snapshot(s.report.worker_id))
               for s in registry.live()]
    bookings = [booking_message(replica, wid, rid, b, now) for wid, rid, b in registry.bookings()]
    return IndexSnapshot(replica=replica, workers=workers, bookings=bookings)


def view_snapshot(replica: str, index: PrefixIndex, worker_id: str) -> IndexSnapshot:
    """``worker_id``'s prefix view, if complete here (else no view: ask its scheduler)."""
    view = index.views.get(worker_id)
    if view is None or not view.synced:
        return IndexSnapshot(replica=replica)
    snap = KVSnapshot(worker_id=worker_id, epoch=view.epoch, seq=view.next_seq,
                      page_size=view.page_size, block_hashes=sorted(view.blocks),
                      host_hashes=sorted(view.host_blocks))
    return IndexSnapshot(replica=replica, views=[snap])


def apply_state(registry: Registry, snap: IndexSnapshot) -> list[str]:
    """Take a peer's workers and bookings; returns the workers whose views it has."""
    for worker in snap.workers:
        registry.restore(worker.report, worker.age_s)
    for booking in snap.bookings:
        adopt_booking(registry, booking)
    return [w.report.worker_id for w in snap.workers if w.synced]
