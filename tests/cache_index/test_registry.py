from libs.protocol.messages import LoadReport
from services.cache_index.policies import POLICIES, least_load
from services.cache_index.registry import Registry


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def report(wid, running=0, waiting=0, free=100, model="m"):
    return LoadReport(worker_id=wid, scheduler_id="s", model=model, running=running,
                      waiting=waiting, free_slots=free, total_slots=100, max_model_len=10,
                      ts=0.0)


def test_liveness_drops_silent_workers():
    clock = Clock()
    reg = Registry(liveness_s=3.0, clock=clock)
    reg.update(report("a"))
    clock.t += 2
    reg.update(report("b"))
    clock.t += 2
    assert [s.report.worker_id for s in reg.live()] == ["b"]
    assert [s.worker_id for s in reg.summaries()] == ["b"]
    assert reg.live("other-model") == []


def test_least_load_counts_bookings_until_released_or_expired():
    clock = Clock()
    reg = Registry(booking_ttl_s=2.0, clock=clock)
    reg.update(report("a", running=1))
    reg.update(report("b", running=1))
    picks = []
    for i in range(4):
        w = least_load(reg.live(), 10, clock()).report.worker_id
        reg.book(w, f"r{i}")
        picks.append(w)
    assert picks.count("a") == picks.count("b") == 2  # bookings spread the burst
    reg.release(picks[0], "r0")
    assert sum(s.inflight(clock()) for s in reg.live()) == 3
    clock.t += 3
    assert all(s.inflight(clock()) == 0 for s in reg.live())


def test_round_robin_cycles():
    reg = Registry(clock=Clock())
    for w in "abc":
        reg.update(report(w))
    rr = POLICIES["round_robin"]()
    picks = [rr(reg.live(), 1, 0).report.worker_id for _ in range(6)]
    assert sorted(picks[:3]) == ["a", "b", "c"] and picks[:3] == picks[3:]
