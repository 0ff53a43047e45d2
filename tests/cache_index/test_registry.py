from libs.protocol.messages import LoadReport
from services.cache_index.registry import RELEASE_GRACE_S, Registry


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def report(wid, running=0, waiting=0, free=100, model="m", **extra):
    return LoadReport(worker_id=wid, scheduler_id="s", model=model, running=running,
                      waiting=waiting, free_slots=free, total_slots=100, max_model_len=10,
                      ts=0.0, **extra)


def test_liveness_drops_silent_workers():
    clock = Clock()
    reg = Registry(liveness_s=3.0, clock=clock)
    assert reg.update(report("a")) is True
    clock.t += 2
    reg.update(report("b"))
    assert reg.update(report("b")) is False
    clock.t += 2
    assert [s.report.worker_id for s in reg.live()] == ["b"]
    assert [s.worker_id for s in reg.summaries()] == ["b"]
    assert reg.live("other-model") == []


def test_bookings_count_until_released_or_expired():
    clock = Clock()
    reg = Registry(booking_ttl_s=2.0, clock=clock)
    reg.update(report("a", running=1))
    reg.book("a", "r1", tokens=10)
    reg.book("a", "r2", tokens=5)
    (state,) = reg.live()
    assert state.inflight(clock()) == 2 and state.load(clock()) == 3
    reg.release("a", "r1")
    assert state.inflight(clock()) == 1
    clock.t += 3
    assert state.inflight(clock()) == 0


def test_a_released_booking_keeps_its_pages_briefly_but_no_load():
    """Its KV events may reach the index after the release (a fork's held prefix)."""
    clock = Clock()
    reg = Registry(booking_ttl_s=5.0, clock=clock)
    reg.update(report("a"))
    reg.book("a", "hold", tokens=64, hashes=frozenset({1, 2, 3}))
    reg.release("a", "hold")
    (state,) = reg.live()
    assert state.inflight(clock()) == 0 and state.load(clock()) == 0
    assert [b.hashes for b in state.live_bookings(clock())] == [frozenset({1, 2, 3})]
    clock.t += RELEASE_GRACE_S + 0.01
    assert state.live_bookings(clock()) == []
    reg.release("a", "unknown")  # a second or unknown release is harmless
