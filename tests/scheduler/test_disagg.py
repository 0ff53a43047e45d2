"""Prefill/decode disaggregation in the core: a prefill core and a decode core, each with
a slot worker, joined by this test as the bus. The slot workers sample a hash of the
sequence read back through the slot table, so a token imported into the wrong slot, a
prefix sent twice or a slot freed while in use changes the outputs."""

from __future__ import annotations

import random

import pytest
from prometheus_client import REGISTRY

from libs.protocol.messages import ErrorInfo, KVReady, SamplingParams, WorkerInfo, staging_id
from services.scheduler.config import CoreConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.disagg import prefill_sampling
from services.scheduler.request import Handoff, Req, Transfer
from services.scheduler.transfer_rates import DEFAULT_TRANSFER_BPS, layout_token_bytes

from .slot_worker import SlotWorker
from .test_core import EOS, assert_all_slots_back, drain

LAYOUT = "2 layers x 1 KV heads x 4 dims, float32"


def make(worker_id, kv_slots=512, role="both", layout=LAYOUT, **cfg):
    info = WorkerInfo(worker_id=worker_id, model="m", kv_slots=kv_slots, max_requests=16,
                      max_model_len=512, vocab_size=1000, eos_token_ids=[EOS], dtype="float32",
                      kv_layout=layout, role=role)
    return SchedulerCore(info, CoreConfig(**cfg)), SlotWorker(kv_slots, 16, 512)


def request(rid, prompt, max_new=4, seed=7, **sp):
    return Req(rid=rid, input_ids=list(prompt), detok_instance="tok",
               sampling=SamplingParams(max_new_tokens=max_new, seed=seed, **sp))


class Pair:
    """Decode core D + prefill core P; ``bus`` moves PrefillRequests, KV and reports."""

    def __init__(self, **cfg) -> None:
        self.d, self.dw = make("d", role="decode", **cfg)
        self.p, self.pw = make("p", role="prefill", **cfg)
        self.moved: dict[str, int] = {}  # transfer id -> tokens sent
        self.fail_next: str = ""  # the next transfer reports this failure
        self.drops: list[str] = []
        self.cancels: list[tuple[str, str]] = []

    def submit(self, req: Req) -> None:
        req.transfer = Transfer(f"t-{req.rid}", "p", 0.1)
        self.d.submit(req)

    def bus(self) -> None:
        for req in self.d.decode.take_requests():  # the PrefillRequest
            t = req.transfer
            pre = Req(rid=t.transfer_id, input_ids=req.input_ids, detok_instance="",
                      sampling=prefill_sampling(req.sampling, req.seed))
            pre.handoff = Handoff(t.transfer_id, "d", "", t.skip, self.d.decode.deadline_s(req))
            self.p.submit(pre)
        for pre in self.p.prefill.take():  # KVSend: export on P, stage on D, report
            tid = pre.handoff.transfer_id
            slots = self.p.prefill.slots(pre)
            self.moved[tid] = len(slots)
            failure, self.fail_next = self.fail_next, ""
            if not failure:
                self.dw.staging[staging_id(tid)] = self.pw.kv[slots].copy()
            self.p.prefill.end(pre)
            error = ErrorInfo(code=failure, message=failure) if failure else None
            self.d.decode.ready(KVReady(transfer_id=tid, ok=not failure, first_token=pre.handoff.first_token,
                                        num_tokens=len(slots), cached_tokens=pre.cached_tokens, error=error))
        for pre, _ in self.p.prefill.take_failed():
            self.d.decode.ready(KVReady(transfer_id=pre.handoff.transfer_id, ok=False))
        self.cancels += self.d.decode.take_cancels()
        for worker, tid in self.cancels:
            self.p.abort(tid)
        self.cancels.clear()
        for tid in self.d.decode.take_drops():
            self.drops.append(tid)
            self.dw.staging.pop(staging_id(tid), None)

    def run(self, limit=20_000) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for _ in range(limit):
            self.bus()
            if not (self.d.has_work() or self.p.has_work() or self.d.decode.pending):
                break
            for core, worker in ((self.p, self.pw), (self.d, self.dw)):
                batch = core.next_batch()
                if batch is not None:
                    core.complete(worker.run(batch))
            for _, delta in self.d.take_deltas():
                out.setdefault(delta.rid, []).extend(delta.token_ids)
            assert not self.p.take_deltas(), "the prefill side never emits tokens"
        return out


def colocated(reqs: list[Req], **cfg) -> dict[str, list[int]]:
    core, worker = make("c", **cfg)
    for r in reqs:
        core.submit(r)
    return drain(core, worker)


def prompts(n, seed=0):
    rng = random.Random(seed)
    docs = [[rng.randrange(3, 900) for _ in range(rng.randrange(20, 80))] for _ in range(3)]
    return [rng.choice(docs)[: rng.randrange(10, 60)] + [rng.randrange(3, 900) for _ in range(rng.randrange(1, 9))]
            for _ in range(n)]


def clone(reqs):
    return [request(r.rid, r.input_ids, r.sampling.max_new_tokens, r.sampling.seed) for r in reqs]


def test_outputs_match_colocated_one_at_a_time_and_concurrently():
    reqs = [request(f"r{i}", p, max_new=5, seed=i) for i, p in enumerate(prompts(24))]
    want = colocated(clone(reqs))
    pair = Pair()
    for r in clone(reqs)[:4]:  # one at a time
        pair.submit(r)
        pair.run()
    for r in clone(reqs)[4:]:  # the rest together
        pair.submit(r)
    got = pair.run()
    for r in reqs[4:]:
        assert got[r.rid] == want[r.rid], r.rid
    assert pair.d.decode.received == len(reqs) and not pair.d.decode.failures
    assert_all_slots_back(pair.d)
    assert_all_slots_back(pair.p)
    assert not pair.dw.staging


def queued(role: str) -> float:
    return REGISTRY.get_sample_value("radixmesh:queue_seconds_count", {"role": role}) or 0.0


def test_queue_times_are_counted_by_role():
    before = queued("decode"), queued("prefill")
    pair = Pair()
    for i, p in enumerate(prompts(3, seed=4)):
        pair.submit(request(f"r{i}", p))
    pair.run()
    assert (queued("decode"), queued("prefill")) == (before[0] + 3, before[1] + 3)


def test_only_tokens_beyond_the_decode_cache_are_sent():
    doc = list(range(100, 160))
    pair = Pair()
    pair.submit(request("a", doc + [5, 6], max_new=3))
    pair.run()
    assert pair.moved["t-a"] == 62  # nothing cached on the decode side: the whole prompt
    pair.submit(request("b", doc + [7, 8, 9], max_new=3))
    pair.run()
    assert pair.moved["t-b"] == 3  # the decode side holds the document now (page size 1)
    assert pair.d.stats().kv_transfers_in == 2 and pair.p.stats().kv_transfers_out == 2


def test_a_failed_transfer_prefills_locally_with_the_same_output():
    reqs = [request(f"r{i}", p, seed=i) for i, p in enumerate(prompts(6, seed=1))]
    want = colocated(clone(reqs))
    pair = Pair()
    pair.fail_next = "transfer_checksum"
    for r in clone(reqs):
        pair.submit(r)
    assert pair.run() == want
    assert pair.d.decode.failures == {"transfer_checksum": 1}
    assert_all_slots_back(pair.d)
    assert_all_slots_back(pair.p)


def test_abort_while_the_kv_is_on_its_way_frees_both_sides():
    pair = Pair()
    pair.submit(request("a", list(range(10, 70)), max_new=4))
    pair.bus()  # the PrefillRequest reached P; nothing computed yet
    assert pair.d.abort("a")
    pair.run()
    assert pair.p.prefill.sent == 0 and pair.d.decode.received == 0
    assert_all_slots_back(pair.d)
    assert_all_slots_back(pair.p)
    assert "t-a" in pair.drops


def test_deadline_falls_back_and_a_late_report_is_dropped():
    pair = Pair()
    req = request("a", list(range(10, 70)), max_new=3)
    pair.submit(req)
    pair.d.next_batch()
    taken = pair.d.decode.take_requests()
    assert taken == [req]
    req.transfer.sent_at = 1.0
    expired = pair.d.decode.expired(1.0 + pair.d.decode.deadline_s(req) + 0.1)
    assert expired == [req]
    pair.d.decode.fall_back(req, "deadline")
    assert pair.d.decode.take_cancels() == [("p", "t-a")]
    # the prefill worker's late report: nobody imports it, so it is dropped at once
    pair.d.decode.ready(KVReady(transfer_id="t-a", ok=True, first_token=5, num_tokens=59))
    assert pair.d.decode.take_drops() == ["t-a", "t-a"]
    want = colocated([request("a", list(range(10, 70)), max_new=3)])
    assert pair.run() == want
    assert pair.d.decode.failures == {"deadline": 1}
    assert_all_slots_back(pair.d)


def test_first_token_eos_ends_without_importing():
    pair = Pair()
    req = request("a", list(range(10, 30)), max_new=4, stop_token_ids=[])
    pair.submit(req)
    pair.bus()
    for _ in range(3):
        batch = pair.p.next_batch()
        if batch is not None:
            pair.p.complete(pair.pw.run(batch))
    (pre,) = pair.p.prefill.take()
    pair.p.prefill.end(pre)
    pair.d.decode.ready(KVReady(transfer_id="t-a", ok=True, first_token=EOS, num_tokens=20))
    pair.d.next_batch()
    (delta,) = [d for _, d in pair.d.take_deltas()]
    assert delta.finish_reason == "stop" and delta.token_ids == [EOS]
    assert pair.d.decode.take_drops() == ["t-a"]
    assert_all_slots_back(pair.d)
    assert_all_slots_back(pair.p)


def test_prefill_worker_lost_reports_and_decode_recomputes():
    pair = Pair()
    pair.submit(request("a", list(range(10, 50)), max_new=3))
    pair.bus()
    pair.p.fail_all(ErrorInfo(code="worker_lost", message="gone"))
    pair.bus()  # the failure report reaches D
    assert pair.d.decode.failures
    out = pair.run()
    assert out == colocated([request("a", list(range(10, 50)), max_new=3)])
    assert_all_slots_back(pair.d)


def test_preallocation_waits_for_room():
    pair = Pair(kv_slots=128)
    for i in range(4):
        pair.submit(request(f"r{i}", [i + 3] * 40 + list(range(200 + i * 50, 210 + i * 50)), max_new=8))
    assert len(pair.d.decode.queue) >= 1  # not all fit at once
    out = pair.run()
    assert len(out) == 4 and all(len(v) == 8 for v in out.values())
    assert_all_slots_back(pair.d)
    assert_all_slots_back(pair.p)


SMOL = "30 layers x 3 KV heads x 64 dims, float32"  # SmolLM2-135M: 46,080 bytes a token


def test_the_transfer_deadline_rests_on_the_measured_transfer_rate():
    core, _ = make("d", role="decode", layout=SMOL)
    book = core.decode
    req = request("a", range(10, 1510))  # 1,500 tokens, none cached here
    req.transfer = Transfer("t-a", "p1", predicted_s=0.5)
    prefill_s = 1500 * 2e-3  # NOTE: more than the router's 0.5 s: at least 2 ms a token
    # nothing measured yet: 69 MB at the prior rate (NATS chunks on one host), 0.115 s
    assert book.deadline_s(req) == pytest.approx(3 * (prefill_s + 1500 * 46_080 / DEFAULT_TRANSFER_BPS) + 1)
    # a transfer from p1 that took 1.4 s for those 69 MB (49 MB/s: a slow network),
    # reported after its request gave up: it measured the path all the same
    book.ready(KVReady(transfer_id="late", ok=True, first_token=1, num_tokens=1500,
                       nbytes=69_120_000, seconds=1.4, prefill_worker="p1"))
    assert book.take_drops() == ["late"]
    assert book.deadline_s(req) == pytest.approx(3 * (prefill_s + 1.4) + 1)
    # a failed one measures nothing; a faster one moves the average (EMA) toward it
    book.ready(KVReady(transfer_id="x", ok=False, nbytes=1000, seconds=10.0, prefill_worker="p1"))
    book.ready(KVReady(transfer_id="y", ok=True, first_token=1, num_tokens=1500,
                       nbytes=69_120_000, seconds=0.1, prefill_worker="p1"))
    rate = 0.8 * 69_120_000 / 1.4 + 0.2 * 69_120_000 / 0.1
    assert book.rates.bps("p1") == pytest.approx(rate)
    # another prefill worker, not measured yet, is assumed like the ones that were
    other = request("b", range(10, 1510))
    other.transfer = Transfer("t-b", "p2", predicted_s=0.5)
    assert book.deadline_s(other) == pytest.approx(book.deadline_s(req))
    # only the tokens beyond what this worker caches move
    req.transfer.skip = 1000
    assert book.deadline_s(req) == pytest.approx(3 * (prefill_s + 500 * 46_080 / rate) + 1)
    # the router reads the rate (tokens/s, over every peer) and the threshold in the load report
    report = core.load_report(core.rates, "s", 0.0)
    assert report.transfer_tps == pytest.approx(book.rates.overall / 46_080)
    assert report.remote_prefill_min_tokens == 256


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_layout_workers_announce_says_a_tokens_kv_bytes(dtype):
    from libs.transfer import KVLayout  # NOTE: the workers' side (torch)

    layout = KVLayout(30, 3, 64, dtype)
    assert layout_token_bytes(layout.describe()) == layout.token_bytes
    assert layout_token_bytes("") == layout_token_bytes("30 layers x 3 KV heads x 64 dims, int4") == 0
