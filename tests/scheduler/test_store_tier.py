"""The shared store (L3) in the core: pages demoted on worker A are put under their
chained page keys; worker B, asked the same document, fetches them into its host tier
at queue time, loads them back and computes only the rest. Slot workers read tokens
back through slots, so a page put or fetched under the wrong key changes outputs."""

from __future__ import annotations

from libs.protocol.hashing import block_hashes
from libs.protocol.messages import ErrorInfo, FetchReply, SamplingParams, WorkerInfo
from libs.transfer.store import page_key, page_keys
from services.scheduler.config import CoreConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.request import Req

from .slot_worker import SlotWorker
from .test_core import EOS, assert_all_slots_back, drain

PAGE = 16
DOC = list(range(100, 100 + 20 * PAGE))  # 320 tokens: 20 pages


def make(worker_id, store, kv_slots=512, host_slots=1024):
    info = WorkerInfo(worker_id=worker_id, model="m", kv_slots=kv_slots, max_requests=8,
                      max_model_len=1024, vocab_size=4000, eos_token_ids=[EOS], dtype="float32",
                      host_kv_slots=host_slots, store_page_tokens=PAGE)
    core = SchedulerCore(info, CoreConfig(page_size=PAGE))
    return core, SlotWorker(kv_slots, 8, 1024, host_slots=host_slots, store=store, page_tokens=PAGE)


def request(rid, prompt, max_new=4):
    return Req(rid=rid, input_ids=list(prompt), detok_instance="tok",
               sampling=SamplingParams(max_new_tokens=max_new, seed=3))


def run(core, worker, reqs, fetch_arrived=None):
    """Submit and drain; a planned fetch is answered by the slot worker's store at once
    (``fetch_arrived`` caps the pages that arrive, as a deadline would)."""
    for r in reqs:
        core.submit(r)
        if core.store and r.rid in core.store.fetching:
            f = core.store.fetching[r.rid][1]
            arrived = worker.fetch(f.keys, f.slots.tolist())
            if fetch_arrived is not None:
                arrived = min(arrived, fetch_arrived)
            core.fetched(r, FetchReply(arrived=arrived, missing=len(f.keys) - arrived,
                                       deadline=fetch_arrived is not None, seconds=0.01))
    return drain(core, worker)


def evict_all(core, worker):
    """Push the document off A's device (to its host tier, and so to the store)."""
    filler = [request(f"f{i}", list(range(2000 + i * 400, 2000 + i * 400 + 380)), 2) for i in range(3)]
    run(core, worker, filler)


def test_keys_of_a_fetch_are_the_keys_the_tree_puts():
    hashes = block_hashes(DOC, PAGE, "tenant")
    assert page_keys("m", "float32", DOC, "tenant", PAGE) == [page_key("m", "float32", h) for h in hashes]


def test_a_document_prefilled_on_a_comes_from_the_store_on_b():
    store: dict = {}
    a, aw = make("a", store)
    want = run(a, aw, [request("r1", DOC + [7, 8, 9])])
    evict_all(a, aw)
    assert a.host.put >= len(DOC) and len(store) >= len(DOC) // PAGE
    b, bw = make("b", store)
    got = run(b, bw, [request("r1", DOC + [7, 8, 9])])
    assert got == want
    stats = b.stats()
    assert stats.store_fetches == {"complete": 1}
    assert stats.store_fetched_tokens == len(DOC)
    assert stats.cached_tokens == len(DOC) and stats.host_loaded_tokens == len(DOC)
    assert_all_slots_back(b)


def tiers(req):
    return (req.cached_tokens - req.cached_host_tokens - req.cached_store_tokens,
            req.cached_host_tokens, req.cached_store_tokens)


def test_store_tokens_are_reported_apart_from_host_and_device():
    store: dict = {}
    a, aw = make("a", store)
    run(a, aw, [request("r1", DOC + [7, 8, 9])])
    evict_all(a, aw)
    b, bw = make("b", store)
    head = request("head", DOC[: 6 * PAGE] + [1, 2, 3])
    run(b, bw, [head], fetch_arrived=0)  # B computes the first 6 pages itself
    whole = request("whole", DOC + [7, 8, 9])
    b.submit(whole)
    f = b.store.fetching["whole"][1]
    assert f.start == 6 * PAGE
    b.fetched(whole, FetchReply(arrived=bw.fetch(f.keys, f.slots.tolist()), seconds=0.01))
    finals = {}
    while b.has_work():
        if (batch := b.next_batch()) is not None:
            b.complete(bw.run(batch))
        finals |= {d.rid: d for _, d in b.take_deltas() if d.finish_reason}
    assert tiers(head) == (0, 0, 0) and tiers(whole) == (6 * PAGE, 0, 14 * PAGE)
    done = finals["whole"]
    assert (done.cached_tokens, done.cached_host_tokens, done.cached_store_tokens) == (len(DOC), 0, 14 * PAGE)
    assert_all_slots_back(b)


def test_only_the_requests_own_fetch_counts_as_store():
    store: dict = {}
    a, aw = make("a", store)
    run(a, aw, [request("r1", DOC + [5])])
    evict_all(a, aw)
    b, bw = make("b", store, host_slots=2048)  # NOTE: room for both copies and half free
    first = request("first", DOC + [5])
    run(b, bw, [first], fetch_arrived=5)  # 5 pages from the store, the rest recomputed
    assert tiers(first) == (0, 0, 5 * PAGE)
    run(b, bw, [request("filler", list(range(3500, 3880)), 2)])  # in no store: B computes it
    assert b.cache.match(request("x", DOC + [6]))[2:4] == (5 * PAGE, 15 * PAGE)  # the rest went to host
    again = request("again", DOC + [6])
    run(b, bw, [again])
    assert tiers(again) == (5 * PAGE, 15 * PAGE, 0)  # what came from the store came for "first"
    assert_all_slots_back(b)


def test_fetched_pages_stay_in_the_host_tier_until_their_request_starts():
    store: dict = {}
    a, aw = make("a", store)
    want = run(a, aw, [request("r1", DOC + [5])])
    evict_all(a, aw)
    b, bw = make("b", store)
    evict_all(b, bw)  # B's host tier is mostly others' copies: making room drops lower-only pages
    again = request("r1", DOC + [5])
    got = run(b, bw, [again])
    assert got == want
    assert tiers(again) == (0, 0, len(DOC))  # not dropped before it started, so not recomputed
    assert not b.cache.tree.pinned
    assert_all_slots_back(b)


def test_the_last_steps_pages_are_put_without_waiting_for_another_request():
    store: dict = {}
    a, aw = make("a", store)
    run(a, aw, [request("r1", DOC + [7], max_new=1)])  # it ends at its prefill step
    assert all(k in store for k in page_keys("m", "float32", DOC, "", PAGE))
    assert not a.has_work() and not a.host.owes_copies


def test_documents_with_the_same_opening_fetched_at_once_both_land():
    """Two fetches planned from an empty tree: the first to land puts the shared opening
    pages in the tree; the second keeps its own pages below them instead of dropping all."""
    store: dict = {}
    other = DOC[: 2 * PAGE] + list(range(3000, 3000 + 10 * PAGE))  # the first 2 pages shared
    a, aw = make("a", store)
    run(a, aw, [request("r1", DOC + [5]), request("r2", other + [5])])
    evict_all(a, aw)
    b, bw = make("b", store)
    one, two = request("one", DOC + [5]), request("two", other + [5])
    for r in (one, two):
        b.submit(r)
    f1, f2 = b.store.fetching["one"][1], b.store.fetching["two"][1]
    assert f1.start == f2.start == 0
    for r, f in ((one, f1), (two, f2)):
        b.fetched(r, FetchReply(arrived=bw.fetch(f.keys, f.slots.tolist()), seconds=0.01))
    assert two.fetched == (2 * PAGE, len(other)) and len(b.cache.tree.pinned) == 20 + 10
    drain(b, bw)
    assert tiers(one) == (0, 0, len(DOC))
    assert tiers(two) == (2 * PAGE, 0, 10 * PAGE)  # the opening: loaded for "one" first
    assert b.stats().store_fetches == {"complete": 2} and not b.cache.tree.pinned
    assert_all_slots_back(b)


def test_a_fetch_is_predicted_behind_those_queued_before_it():
    store: dict = {}
    a, aw = make("a", store)
    run(a, aw, [request("r1", DOC + [5]), request("r2", [1] + DOC[1:] + [5])])
    evict_all(a, aw)
    b, _ = make("b", store)
    b.store.fetch_tps = 4 * len(DOC)  # a document in 0.25 s (so 3x: 0.75 s)
    b.rates.prefill_tps = len(DOC)  # recomputing it: 1 s
    b.submit(request("x", DOC + [5]))
    b.submit(request("y", [1] + DOC[1:] + [5]))  # the same pages but the first: behind "x"
    assert b.store.fetching["x"][1].deadline_s == 0.75
    assert b.store.fetching["y"][1].deadline_s == 1.0  # min(recompute, 3 x 0.5 s)


def test_a_document_asked_again_while_fetched_waits_for_that_fetch():
    store: dict = {}
    a, aw = make("a", store)
    want = run(a, aw, [request("r1", DOC + [5]), request("r2", DOC + [6, 7])])
    evict_all(a, aw)
    b, bw = make("b", store)
    first, again = request("r1", DOC + [5]), request("r2", DOC + [6, 7])
    b.submit(first)
    b.submit(again)
    assert list(b.store.fetching) == ["r1"] and b.store.riders == {"r1": [again]}
    assert b.stats().waiting == 2
    f = b.store.fetching["r1"][1]
    b.fetched(first, FetchReply(arrived=bw.fetch(f.keys, f.slots.tolist()), seconds=0.01))
    got = drain(b, bw)
    assert got == want and b.stats().store_fetches == {"complete": 1, "joined": 1}
    assert b.stats().store_fetched_tokens == len(DOC)  # downloaded once
    assert tiers(first) == (0, 0, len(DOC))
    assert again.cached_tokens == len(DOC) and again.cached_host_tokens == 0  # device or store, never host
    assert_all_slots_back(b)


def test_riders_end_with_their_fetch_aborted_or_failed():
    store: dict = {}
    a, aw = make("a", store)
    run(a, aw, [request("r1", DOC + [5])])
    evict_all(a, aw)
    b, bw = make("b", store)
    owner, rider, gone = request("o", DOC + [5]), request("r", DOC + [6]), request("g", DOC + [7])
    for r in (owner, rider, gone):
        b.submit(r)
    b.abort("o")  # the one that asked for the pages leaves: the others still get them
    b.abort("g")
    f = b.store.fetching["o"][1]
    b.fetched(owner, FetchReply(arrived=bw.fetch(f.keys, f.slots.tolist()), seconds=0.01))
    ended = {d.rid: d.finish_reason for _, d in b.take_deltas()}
    assert ended == {"o": "abort", "g": "abort"}
    assert list(b.waiting) == [rider] and b.cache.tree.pinned
    drain(b, bw)
    assert tiers(rider) == (0, 0, len(DOC))
    assert_all_slots_back(b)
    c, _ = make("c", store)
    owner, rider = request("o", DOC + [5]), request("r", DOC + [6])
    c.submit(owner)
    c.submit(rider)
    c.fail_all(ErrorInfo(code="worker_lost", message="gone", status=503))
    assert {d.rid: d.finish_reason for _, d in c.take_deltas()} == {"o": "error", "r": "error"}
    assert c.host.num_free == c.info.host_kv_slots and not c.has_work()


def test_pages_are_put_when_computed_not_only_when_evicted():
    store: dict = {}
    a, aw = make("a", store)
    run(a, aw, [request("r1", DOC + [7, 8, 9])])
    keys = page_keys("m", "float32", DOC, "", PAGE)
    assert all(k in store for k in keys)  # before anything was evicted
    assert a.stats().store_put_tokens >= len(DOC)
    run(a, aw, [request("r2", DOC + [1, 2])])
    assert a.stats().store_put_tokens < 2 * len(DOC) + 2 * PAGE  # a page is put once


def test_pages_that_missed_the_deadline_are_recomputed():
    store: dict = {}
    a, aw = make("a", store)
    want = run(a, aw, [request("r1", DOC + [5])])
    evict_all(a, aw)
    b, bw = make("b", store)
    late = request("r1", DOC + [5])
    got = run(b, bw, [late], fetch_arrived=5)
    assert got == want
    assert tiers(late) == (0, 0, 5 * PAGE)
    assert b.stats().store_fetches == {"deadline": 1}
    assert b.stats().cached_tokens == 5 * PAGE
    assert_all_slots_back(b)


def test_a_store_without_the_pages_costs_nothing_but_the_miss():
    b, bw = make("b", {})
    out = run(b, bw, [request("r1", DOC + [5])])
    assert len(out["r1"]) == 4
    assert b.stats().store_fetches == {"miss": 1} and b.stats().store_fetched_tokens == 0
    assert_all_slots_back(b)  # the fetch's host slots are back: free or held by a tree node


def test_tenants_never_fetch_each_others_pages():
    store: dict = {}
    a, aw = make("a", store)
    doc = request("r1", DOC + [5])
    doc.namespace = "tenant-a"
    run(a, aw, [doc])
    evict_all(a, aw)
    b, bw = make("b", store)
    other = request("r2", DOC + [5])
    other.namespace = "tenant-b"
    run(b, bw, [other])
    assert b.stats().store_fetches == {"miss": 1} and b.stats().cached_tokens == 0


def test_an_abort_while_fetching_frees_the_host_slots():
    store: dict = {}
    a, aw = make("a", store)
    run(a, aw, [request("r1", DOC + [5])])
    evict_all(a, aw)
    b, bw = make("b", store)
    req = request("r1", DOC + [5])
    b.submit(req)
    assert "r1" in b.store.fetching and b.host.num_free < b.info.host_kv_slots
    b.abort("r1")
    b.fetched(req, FetchReply(arrived=20))
    (delta,) = [d for _, d in b.take_deltas()]
    assert delta.finish_reason == "abort"
    assert b.host.num_free == b.info.host_kv_slots and not b.has_work()
    assert_all_slots_back(b)


def test_pages_are_named_by_the_kv_dtype_not_the_models():
    """A worker computing in fp32 over bf16 KV puts bf16 pages: a worker whose pool is fp32 must
    not read them as its own (the store's keys carry the pool's dtype)."""
    def prefix(**kv):
        info = WorkerInfo(worker_id="w", model="m", kv_slots=64, max_requests=8, max_model_len=1024, vocab_size=4000,
                          eos_token_ids=[EOS], dtype="float32", host_kv_slots=64, store_page_tokens=PAGE, **kv)
        return SchedulerCore(info, CoreConfig(page_size=PAGE)).store.keys.prefix

    assert prefix(kv_dtype="bfloat16") == "m.bfloat16"
    assert prefix() == "m.float32"  # a worker that does not say: its dtype's
