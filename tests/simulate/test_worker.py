import numpy as np
import pytest

from radixmesh.simulate.model import ServiceModel
from radixmesh.simulate.worker import SimRequest, SimWorker
from services.cache_index.prefix_index import PrefixIndex

MODEL = ServiceModel(prefill_tps=1000.0, decode_base_s=0.05, decode_per_seq_s=0.01,
                     chunk_tokens=64, kv_slots=1024, page_size=16)
rng = np.random.default_rng(0)


def tokens(n: int) -> np.ndarray:
    return rng.integers(0, 1000, n, dtype=np.int64)


def request(i: int, prompt: np.ndarray, out: int = 3) -> SimRequest:
    return SimRequest(i, prompt, tokens(out), 0.0)


def serve(worker: SimWorker, index: PrefixIndex | None = None, t: float = 0.0) -> float:
    """Run steps until idle; mirror the events into ``index``; the time at the end."""
    while (seconds := worker.plan_step()) is not None:
        t += seconds
        worker.complete_step(t, seconds)
        if index is not None and (batch := worker.take_events()) is not None:
            assert index.on_events(batch)
    return t


def assert_consistent(worker: SimWorker) -> None:
    cache = worker.core.cache
    size = cache.tree.size_info()
    assert size.protected == 0 and cache.free + size.total == worker.model.kv_slots
    assert not worker.core.has_work() and not worker.core.inflight
    cache.tree.check_integrity()


def cached_len(worker: SimWorker, tokens) -> int:
    return worker.core.cache.tree.peek("", list(tokens)).length


def test_chunked_prefill_then_decode_timing():
    w = SimWorker("w", MODEL)
    r = request(0, tokens(100))
    w.submit(r)
    end = serve(w)
    # chunks of 64 and 36 tokens, then 2 decode steps of one request
    assert r.first_token_at == pytest.approx(0.05 + 0.064 + 0.05 + 0.036)
    assert r.finished_at == end == pytest.approx(r.first_token_at + 2 * 0.06)
    assert r.cached == 0 and w.served == 1 and w.prefilled == 100
    assert cached_len(w, np.concatenate((r.tokens, r.outputs[:2]))) == 96  # prompt + 2 outputs, page aligned
    assert_consistent(w)


def test_second_request_hits_the_shared_document():
    w = SimWorker("w", MODEL)
    doc = tokens(80)
    a, b = (request(i, np.concatenate((doc, tokens(20)))) for i in range(2))
    w.submit(a)
    t = serve(w)
    w.submit(b)
    serve(w, t=t)
    assert (a.cached, b.cached) == (0, 80)
    assert w.prefilled == 100 + 20
    assert_consistent(w)


def test_request_waits_for_the_prefix_being_prefilled():
    w = SimWorker("w", MODEL)
    doc = tokens(80)
    a, b = (request(i, np.concatenate((doc, tokens(20)))) for i in range(2))
    w.submit(a)
    w.submit(b)
    w.plan_step()
    assert [r.rid for r in w.core.running] == ["r0"]  # b waits for a's prefix: deferred
    assert [r.rid for r in w.core.waiting] == ["r1"]
    w.complete_step(0.1, 0.1)
    serve(w, t=0.1)
    assert b.cached == 64  # a's first chunk, cached after step 1
    assert_consistent(w)


def test_kv_capacity_limits_admission_and_lru_evicts():
    small = ServiceModel(prefill_tps=1000.0, chunk_tokens=1024, kv_slots=256, page_size=16)
    w = SimWorker("w", small)
    index = PrefixIndex()
    index.on_snapshot(w.snapshot())
    reqs = [request(i, tokens(150)) for i in range(3)]
    for r in reqs:
        w.submit(r)
    running = []
    t = 0.0
    while (seconds := w.plan_step()) is not None:
        running.append(len(w.core.running))
        t += seconds
        w.complete_step(t, seconds)
        if (batch := w.take_events()) is not None:
            assert index.on_events(batch)
    assert max(running) == 1  # 2 x (150 + 2) > 256 slots: one at a time
    assert all(r.finished_at > 0 for r in reqs)
    assert cached_len(w, reqs[0].tokens) == 0  # the oldest was evicted
    assert index.views["w"].blocks == set(w.core.cache.tree.all_hashes())
    assert_consistent(w)


def test_load_report_shows_queue_and_measured_rates():
    w = SimWorker("w", MODEL)
    for i in range(3):
        w.submit(request(i, tokens(100)))
    report = w.load_report(1.0)
    assert (report.waiting, report.running, report.queued_prefill_tokens) == (3, 0, 300)
    assert report.model == "sim" and report.free_slots == 1024 and report.prefill_tps == 0.0
    serve(w)
    report = w.load_report(9.0)
    assert report.waiting == report.running == report.queued_prefill_tokens == 0
    assert report.prefill_tps > 0 and report.decode_step_s > 0


def test_a_host_tier_keeps_what_the_device_pool_cannot():
    """Documents cycled through a pool too small for them: with a host tier the
    real core loads them back (priced at the copy rate) instead of recomputing."""
    small = ServiceModel(prefill_tps=1000.0, chunk_tokens=1024, kv_slots=256, page_size=16)
    tiered = ServiceModel(prefill_tps=1000.0, chunk_tokens=1024, kv_slots=256, page_size=16,
                          host_slots=2048, host_load_tps=50_000.0)
    docs = [tokens(160) for _ in range(3)]
    results = {}
    for name, model in (("plain", small), ("tiered", tiered)):
        w = SimWorker("w", model)
        reqs = [request(i, np.concatenate((docs[i % 3], tokens(8)))) for i in range(9)]
        t = 0.0
        for r in reqs:  # one at a time: each document is evicted before it comes back
            w.submit(r)
            t = serve(w, t=t)
        assert_consistent(w)
        results[name] = (sum(r.cached for r in reqs), w.prefilled, t)
    (plain_hit, plain_prefill, plain_t), (hit, prefill, t) = results["plain"], results["tiered"]
    assert plain_hit == 0 and hit >= 6 * 160  # the second and third rounds come back
    assert prefill < plain_prefill - 900 and t < plain_t
