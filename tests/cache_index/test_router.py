"""Routing decisions over a real PrefixIndex and Registry (no broker)."""

import pytest

from libs.protocol import ServiceError
from libs.protocol.hashing import block_hashes
from libs.protocol.messages import KVEvent, KVEventBatch, RouteRequest
from services.cache_index.policies import score
from services.cache_index.prefix_index import PrefixIndex
from services.cache_index.router import Router
from services.cache_index.registry import Registry

from .test_registry import Clock, report

DOC = list(range(1000, 1400))


def cached_on(index: PrefixIndex, worker: str, tokens, salt=""):
    batch = KVEventBatch(worker_id=worker, epoch=1, seq=0, page_size=16,
                         events=[KVEvent(kind="stored", namespace=salt,
                                         block_hashes=block_hashes(tokens, 16, salt))])
    from libs.protocol.messages import KVSnapshot
    index.on_snapshot(KVSnapshot(worker_id=worker, epoch=1, seq=0, page_size=16, block_hashes=[]))
    assert index.on_events(batch)


def setup(policy="cache_aware", **loads):
    clock = Clock()
    reg = Registry(clock=clock)
    for wid in ("a", "b", "c"):
        reg.update(report(wid, **loads.get(wid, {})))
    index = PrefixIndex()
    return Router(reg, index, policy), index, reg


def req(rid, tokens, salt=""):
    return RouteRequest(rid=rid, model="m", num_tokens=len(tokens), input_ids=tokens,
                        cache_salt=salt)


def test_cache_aware_goes_where_the_prefix_is():
    router, index, _ = setup()
    cached_on(index, "b", DOC)
    decision = router.route(req("r1", DOC + [1, 2, 3]))
    assert decision.chosen.worker_id == "b"
    assert {c.worker_id: c.cached for c in decision.candidates} == {"a": 0, "b": 400, "c": 0}


def test_salt_is_part_of_the_match():
    router, index, _ = setup()
    cached_on(index, "b", DOC, salt="tenant-1")
    decision = router.route(req("r1", DOC + [7], salt="tenant-2"))
    assert all(c.cached == 0 for c in decision.candidates)


def test_burst_of_one_document_sticks_to_one_worker_via_bookings():
    router, _, _ = setup()
    first = router.route(req("r0", DOC + [1])).chosen.worker_id
    later = {router.route(req(f"r{i}", DOC + [i])).chosen.worker_id for i in range(1, 5)}
    assert later == {first}


def test_imbalance_guard_falls_back_to_least_load():
    router, index, _ = setup(b={"running": 20, "waiting": 10})
    cached_on(index, "b", DOC)
    assert router.route(req("r1", DOC + [1])).chosen.worker_id != "b"


def test_prefix_hash_is_stable_and_spreads():
    router, _, reg = setup("prefix_hash")
    docs = [list(range(i * 100, i * 100 + 80)) for i in range(30)]
    first = [router.route(req(f"x{i}", d)).chosen.worker_id for i, d in enumerate(docs)]
    again = [router.route(req(f"y{i}", d + [5])).chosen.worker_id for i, d in enumerate(docs)]
    assert first == again and len(set(first)) == 3


def test_round_robin_and_exclusion():
    router, _, _ = setup("round_robin")
    picks = [router.route(req(f"r{i}", [1, 2, 3])).chosen.worker_id for i in range(6)]
    assert sorted(picks[:3]) == ["a", "b", "c"] and picks[:3] == picks[3:]
    only = RouteRequest(rid="z", model="m", num_tokens=3, input_ids=[1, 2, 3], exclude=["a", "b"])
    assert router.route(only).chosen.worker_id == "c"
    with pytest.raises(ServiceError):
        router.route(RouteRequest(rid="z", model="m", num_tokens=3, exclude=["a", "b", "c"]))


def test_fork_branches_stay_with_their_document_while_siblings_queue():
    """b holds a fork's document with six sibling branches waiting on it; its report
    counts their uncached suffixes only (services/scheduler: queued_prefill_tokens
    leaves out each waiting request's cached prefix), so the next branch joins them
    instead of recomputing the document on an idle worker. Counted whole (6 x 420
    tokens), the same queue would look ~14 s long and send it elsewhere."""
    rates = {"prefill_tps": 180.0}
    router, index, reg = setup(a=rates, b=rates, c=rates)
    cached_on(index, "b", DOC)
    reg.update(report("b", waiting=6, queued_prefill_tokens=6 * 20, **rates))
    decision = router.route(req("late-branch", DOC + [9] * 30))
    assert decision.chosen.worker_id == "b"


def in_host_tier(index: PrefixIndex, worker: str, device_tokens, host_tokens, seq=1):
    """``worker`` keeps ``device_tokens`` on the device and the pages after them in its host tier."""
    pages = block_hashes(host_tokens, 16, "")
    cached_on(index, worker, host_tokens)
    moved = [KVEvent(kind="stored", namespace="", block_hashes=pages, medium="host"),
             KVEvent(kind="removed", namespace="", block_hashes=pages[len(device_tokens) // 16:])]
    assert index.on_events(KVEventBatch(worker_id=worker, epoch=1, seq=seq, page_size=16,
                                        events=moved))


def test_host_tier_pages_are_credited_at_the_workers_measured_load_rate():
    # a: the whole document on the device; b: a quarter on the device, the rest in host
    # memory, loaded back fast; c: the same split, but its host tier is slow
    router, index, reg = setup(b={"prefill_tps": 1000.0, "host_load_tps": 50_000.0},
                               c={"prefill_tps": 1000.0, "host_load_tps": 500.0},
                               a={"prefill_tps": 1000.0, "running": 3, "queued_prefill_tokens": 600})
    cached_on(index, "a", DOC)
    in_host_tier(index, "b", DOC[:96], DOC)
    in_host_tier(index, "c", DOC[:96], DOC)
    decision = router.route(req("r1", DOC + [1]))
    split = {c.worker_id: (c.cached, c.cached_host) for c in decision.candidates}
    assert split == {"a": (400, 0), "b": (96, 304), "c": (96, 304)}
    scores = {c.worker_id: c.score for c in decision.candidates}
    # b loads 304 tokens in ~6 ms; a first has 600 queued tokens (0.6 s); c's slow host
    # tier (0.6 s) is worth less than recomputing would cost a cold worker (0.8 s)
    assert decision.chosen.worker_id == "b" and scores["b"] < scores["a"] < scores["c"]
    assert scores["c"] < 2 * 401 / 1000  # still cheaper than computing it all


def pd_setup(roles: dict[str, tuple[str, str]]):
    """Workers by id -> (role, kv_layout)."""
    clock = Clock()
    reg = Registry(clock=clock)
    for wid, (role, layout) in roles.items():
        reg.update(report(wid, role=role, kv_layout=layout))
    return Router(reg, PrefixIndex(), "cache_aware"), reg


def test_a_decode_worker_gets_a_prefill_peer_by_prefix_and_queue():
    router, reg = pd_setup({"d1": ("decode", "L"), "p1": ("prefill", "L"), "p2": ("prefill", "L")})
    cached_on(router.index, "p2", DOC)
    decision = router.route(req("r1", DOC + [1, 2]))
    assert decision.chosen.worker_id == "d1"  # a prefill-only worker never serves it
    assert decision.prefill.worker_id == "p2"  # it holds the document
    assert decision.attributes("cache_aware")["radixmesh.route.prefill_worker"] == "p2"


def test_prefill_peers_must_share_the_kv_layout_and_colocated_workers_get_none():
    router, _ = pd_setup({"d1": ("decode", "fp32"), "p1": ("prefill", "bf16")})
    decision = router.route(req("r1", DOC))
    assert decision.chosen.worker_id == "d1" and decision.prefill is None
    router, _ = pd_setup({"c1": ("both", "L"), "p1": ("prefill", "L")})
    decision = router.route(req("r2", DOC))
    assert decision.chosen.worker_id == "c1" and decision.prefill is None


def test_only_prefill_workers_left_serve_alone():
    router, _ = pd_setup({"d1": ("decode", "L"), "p1": ("prefill", "L")})
    decision = router.route(RouteRequest(rid="r", model="m", num_tokens=len(DOC), input_ids=DOC,
                                         exclude=["d1"]))
    assert decision.chosen.worker_id == "p1" and decision.prefill is None


TEMPLATE = list(range(5000, 5032))  # a chat template's opening: two pages every stream shares


def decode_pair(p1_tps: float = 800.0, **measured):
    """Decode workers d1 and d2 (d1 holds the template and measured a faster prefill: what
    made the bench send 7 of 8 streams to one of them), a prefill worker p1."""
    clock = Clock()
    reg = Registry(clock=clock)
    for wid in ("d1", "d2"):
        reg.update(report(wid, role="decode", kv_layout="L", free=4096, **measured.get(wid, {})))
    reg.update(report("p1", role="prefill", kv_layout="L", free=4096, prefill_tps=p1_tps))
    router = Router(reg, PrefixIndex(), "cache_aware")
    cached_on(router.index, "d1", TEMPLATE)
    return router, reg, clock


def stream(rid: str, tokens, max_new_tokens: int) -> RouteRequest:
    return RouteRequest(rid=rid, model="m", num_tokens=len(tokens), input_ids=tokens,
                        max_new_tokens=max_new_tokens)


def route_streams(max_new_tokens: int) -> dict[str, int]:
    """Eight streams arriving 0.7 s apart (each reported running by the next one)."""
    measured = {"d1": {"prefill_tps": 700.0}, "d2": {}}
    router, reg, clock = decode_pair(**measured)
    running = {"d1": 0, "d2": 0}
    for i in range(8):
        prompt = TEMPLATE + [9000 + 100 * i + k for k in range(80)]
        chosen = router.route(stream(f"s{i}", prompt, max_new_tokens)).chosen.worker_id
        running[chosen] += 1
        clock.t += 0.7
        for wid in running:
            reg.update(report(wid, role="decode", kv_layout="L", free=4096, running=running[wid],
                              **measured[wid]))
    return running


def test_decode_streams_spread_over_decode_workers_by_their_decode_load():
    assert route_streams(max_new_tokens=0) == {"d1": 8, "d2": 0}  # the load unweighed: all on d1
    assert route_streams(max_new_tokens=128) == {"d1": 4, "d2": 4}


def test_a_decode_worker_holding_the_prefix_wins_unless_its_batch_is_much_larger():
    step = {"decode_step_s": 0.05, "decode_row_s": 0.008, "prefill_tps": 500.0}

    def pick(d1_running: int) -> tuple[str, dict[str, float]]:
        router, _, _ = decode_pair(p1_tps=500.0, d1={**step, "running": d1_running,
                                       "decode_step_s": 0.05 + (d1_running - 1) * 0.008}, d2=step)
        cached_on(router.index, "d1", DOC)
        decision = router.route(stream("r", DOC + [1, 2, 3], 64))
        assert decision.prefill.worker_id == "p1"
        return decision.chosen.worker_id, {c.worker_id: c.decode_s for c in decision.candidates}

    # d1 runs one stream: each of 64 steps costs 16 ms more there (its own step has a
    # second row, and it adds a row to that stream's: 2 x 8 ms), 1.0 s in all, against
    # 2 x 400 / 500 = 1.6 s of prefill saved (predicted TTFT + recomputation: d1 computes
    # the 3 tokens beyond DOC itself, d2 would leave all 403 to p1 at 500 tokens/s)
    chosen, decode_s = pick(1)
    assert chosen == "d1" and decode_s["d1"] == pytest.approx(64 * (0.05 + 0.008 + 0.008))
    assert decode_s["d2"] == pytest.approx(64 * 0.05)
    chosen, decode_s = pick(8)  # d1 runs 8: 64 x 16 x 8 ms = 8.2 s more
    assert chosen == "d2" and decode_s["d1"] - decode_s["d2"] == pytest.approx(64 * 16 * 0.008)


def test_a_decode_worker_without_free_kv_for_the_stream_is_passed_over():
    router, reg, _ = decode_pair()
    cached_on(router.index, "d1", DOC)
    reg.update(report("d1", role="decode", kv_layout="L", free=40))  # holds DOC, no room to decode
    decision = router.route(stream("r", DOC + [1, 2, 3], 64))
    assert {c.worker_id: c.fits for c in decision.candidates} == {"d1": False, "d2": True}
    assert decision.chosen.worker_id == "d2"


def test_an_unmeasured_decode_worker_is_assumed_like_its_measured_peers():
    from services.cache_index.policies import DecodePrior

    reports = [report("a", running=4, decode_step_s=0.08, decode_row_s=0.01),
               report("b", running=1, decode_step_s=0.05), report("c")]
    prior = DecodePrior.of(reports)
    assert prior.row_s == pytest.approx(0.01)  # b and c measured none
    assert prior.step_s == pytest.approx((0.08 - 3 * 0.01 + 0.05) / 2)  # one-row steps
    assert DecodePrior.of([report("c")]) == DecodePrior()


def test_a_decode_worker_leaving_the_prompt_to_a_peer_is_credited_its_prefix_at_the_transfer_rate():
    """A 1,000-token prompt; d1 holds its first 400 tokens, d2 none: both leave it to a
    prefill peer (600 and 1,000 tokens uncached, >= 256), the one holding the document
    (p2) computes it. d1's prefix saves moving 400 tokens' KV (400 / 10,000 tokens/s:
    40 ms), not computing them (2 x 400 / 500 = 1.6 s): its one running stream (64 steps
    x 16 ms = 1.0 s) sends the request to d2."""
    step = {"decode_step_s": 0.05, "decode_row_s": 0.008, "prefill_tps": 500.0, "transfer_tps": 10_000.0}
    prompt = DOC + list(range(20_000, 20_600))

    def route(**d1):
        clock = Clock()
        reg = Registry(clock=clock)
        reg.update(report("d1", role="decode", kv_layout="L", free=4096,
                          **{**step, "running": 1, **d1}))
        reg.update(report("d2", role="decode", kv_layout="L", free=4096, **step))
        for wid in ("p1", "p2"):
            reg.update(report(wid, role="prefill", kv_layout="L", free=4096, prefill_tps=800.0))
        router = Router(reg, PrefixIndex(), "cache_aware")
        cached_on(router.index, "d1", DOC)
        cached_on(router.index, "p2", DOC)
        decision = router.route(stream("r", prompt, 64))
        return decision, {c.worker_id: c for c in decision.candidates}

    decision, c = route()
    assert decision.chosen.worker_id == "d2" and decision.prefill.worker_id == "p2"
    peer = 2 * 600 / 800  # p2's predicted TTFT and compute: the pair's prefill part
    assert c["d2"].score == pytest.approx(peer + 1000 / 10_000 + 0.05 + 64 * 0.05)
    assert c["d1"].score - c["d2"].score == pytest.approx(64 * 0.016 - 400 / 10_000)
    # credited at d1's own prefill rate, as if it computed the prompt, d1 would have won
    assert score(c["d1"], len(prompt)) < score(c["d2"], len(prompt))
    # a d1 that prefills 600 uncached tokens itself (its threshold is higher) is scored so
    _, c = route(remote_prefill_min_tokens=1000)
    assert c["d1"].score == pytest.approx(score(c["d1"], len(prompt)))
    assert c["d1"].score == pytest.approx(2 * 600 / 500 + 0.05 + 64 * (0.05 + 0.008 + 0.008))


def test_a_request_the_decode_worker_prefills_itself_is_scored_so_and_gets_no_peer():
    """Logprobs, a regex or a resumed output keep the prefill on the decode worker
    (RouteRequest.local_prefill): scored as its own prefill, no prefill worker booked."""
    step = {"decode_step_s": 0.05, "prefill_tps": 500.0, "transfer_tps": 10_000.0}
    clock = Clock()
    reg = Registry(clock=clock)
    reg.update(report("d1", role="decode", kv_layout="L", free=4096, **step))
    reg.update(report("p1", role="prefill", kv_layout="L", free=4096, prefill_tps=800.0))
    router = Router(reg, PrefixIndex(), "cache_aware")
    remote = router.route(stream("r1", DOC, 8))
    assert remote.prefill.worker_id == "p1"
    (d1,) = remote.candidates
    assert d1.score < score(d1, len(DOC))  # the pair is quicker than its own prefill
    (p1,) = [s for s in reg.live() if s.report.worker_id == "p1"]
    booked = len(p1.live_bookings(clock()))
    local = router.route(RouteRequest(rid="r2", model="m", num_tokens=len(DOC), input_ids=DOC,
                                      max_new_tokens=8, local_prefill=True))
    assert local.chosen.worker_id == "d1" and local.prefill is None
    (d1,) = local.candidates
    assert d1.score == pytest.approx(score(d1, len(DOC)))
    assert len(p1.live_bookings(clock())) == booked  # nothing booked on the prefill worker


def test_a_decode_worker_prefills_itself_when_the_prefill_side_is_backlogged():
    """--local-prefill-factor 2: d1 (500 tokens/s) prefills a 400-token prompt itself once
    its peer's queue delays the pair's first token past twice its own (0.85 s), not before;
    with the factor 0 the prompt always goes to the peer. An unmeasured d1 is assumed to
    prefill at its peer's rate (800 tokens/s), not at the default."""
    def route(queued: int, factor: float = 2.0, **d1):
        clock = Clock()
        reg = Registry(clock=clock)
        reg.update(report("d1", role="decode", kv_layout="L", free=4096, decode_step_s=0.05,
                          transfer_tps=10_000.0, **d1))
        reg.update(report("p1", role="prefill", kv_layout="L", free=4096, prefill_tps=800.0,
                          queued_prefill_tokens=queued))
        router = Router(reg, PrefixIndex(), "cache_aware", local_prefill_factor=factor)
        decision = router.route(stream("r", DOC, 8))
        (p1,) = [s for s in reg.live() if s.report.worker_id == "p1"]
        return decision, len(p1.live_bookings(clock()))

    near, booked = route(queued=500, prefill_tps=500.0)  # the pair's first token: 1.17 s
    assert near.prefill.worker_id == "p1" and booked == 1
    far, booked = route(queued=2_000, prefill_tps=500.0)  # 3.04 s: d1 prefills it, scored so
    (d1,) = far.candidates
    assert far.chosen.worker_id == "d1" and far.prefill is None and booked == 0
    assert d1.score == pytest.approx(score(d1, len(DOC))) == pytest.approx(2 * 400 / 500 + 0.05 + 8 * 0.05, rel=0.05)
    never, _ = route(queued=2_000, factor=0.0, prefill_tps=500.0)
    assert never.prefill.worker_id == "p1"
    # 1.29 s against 2 x 0.55 s (at p1's 800 tokens/s; at the default 500 it would be 2 x 0.85 s)
    unmeasured, _ = route(queued=600)
    assert unmeasured.prefill is None
