"""The overlap schedule: step N+1 planned and sent before step N's result.

Every workload runs twice on the slot-reading worker, once waiting for each
result (the reference) and once with a step always planned ahead; outputs,
logprobs, finish reasons and the slots given back must be the same.
"""

from __future__ import annotations

from collections import deque

import pytest

from libs.protocol.messages import ForwardResult

from .slot_worker import SlotWorker
from .test_core import assert_all_slots_back, branching_prompts, make, req


def run(b, w: SlotWorker, overlap: bool, abort_at: dict[int, str] | None = None) -> dict:
    """Step like the worker loop; returns per rid: tokens, finish, logprobs."""
    inflight: deque[ForwardResult] = deque()
    out: dict[str, dict] = {}
    ahead = calls = 0
    while b.has_work() or inflight:
        calls += 1
        assert calls < 20_000
        if not inflight:
            batch = b.next_batch()
            assert batch is not None, "work left but nothing to run"
            inflight.append(w.run(batch))
        if overlap and len(inflight) == 1 and (batch := b.next_batch()) is not None:
            ahead += -1 in batch.input_ids
            inflight.append(w.run(batch))  # NOTE: the worker runs steps in the order sent
        if abort_at and calls in abort_at:
            b.abort(abort_at[calls])
        b.complete(inflight.popleft())
        for _, d in b.take_deltas():
            rec = out.setdefault(d.rid, {"tokens": [], "finish": None, "lp": [], "lp_ids": []})
            assert rec["finish"] is None, f"{d.rid}: a delta after its finish"
            rec["tokens"] += d.token_ids
            rec["finish"] = d.finish_reason
            if d.logprobs is not None:
                assert d.logprobs.start == len(rec["lp"]) + (rec["lp_start"] if rec["lp"] else 0) \
                    or not rec["lp"]
                rec.setdefault("lp_start", d.logprobs.start)
                rec["lp"] += [None if v != v else v for v in d.logprobs.logprobs]  # NaN: token 0
                rec["lp_ids"] += d.logprobs.token_ids
    assert_all_slots_back(b)
    out["_ahead"] = ahead
    return out


def both(submit, **cfg) -> tuple[dict, dict]:
    results = []
    for overlap in (False, True):
        b, w = make(**cfg)
        submit(b)
        results.append(run(b, w, overlap))
    sync, ahead = results
    assert sync.pop("_ahead") == 0
    return sync, ahead


def submit_prompts(prompts, **sp):
    def submit(b):
        for i, p in enumerate(prompts):
            b.submit(req(f"r{i}", prompt=p, max_new=6 + i % 5, **sp))
    return submit


@pytest.mark.parametrize("cfg", [
    dict(kv_slots=4096, enable_cache=False),
    dict(kv_slots=4096, chunked_prefill_size=16),
    dict(kv_slots=4096, chunked_prefill_size=16, schedule_policy="lpm", page_size=4),
    dict(kv_slots=160, max_requests=8, chunked_prefill_size=16),  # retracts: planned in sync
    dict(kv_slots=400, chunked_prefill_size=16, retract_interval=3),
])
def test_outputs_match_the_step_by_step_schedule(cfg):
    sync, ahead = both(submit_prompts(branching_prompts(40, seed=11)), **cfg)
    steps_ahead = ahead.pop("_ahead")
    assert ahead == sync
    assert steps_ahead > 10  # decodes really were sent ahead of their input token


def test_stops_while_a_step_is_in_flight_drop_its_token():
    # ~1 in 6 sampled tokens is a stop token: requests end while the next step runs
    stops = list(range(3, 20))
    sync, ahead = both(submit_prompts(branching_prompts(30, seed=5), stop_token_ids=stops),
                       kv_slots=4096, chunked_prefill_size=16)
    ahead.pop("_ahead")
    assert ahead == sync
    assert sum(r["finish"] == "stop" for r in sync.values()) >= 5


def test_logprobs_through_steps_sent_ahead():
    prompts = branching_prompts(12, seed=3)

    def submit(b):
        for i, p in enumerate(prompts):
            b.submit(req(f"r{i}", prompt=p, max_new=5 + i % 4, return_logprob=True,
                         logprob_start_len=[-1, 0, 3][i % 3]))
    sync, ahead = both(submit, kv_slots=4096, chunked_prefill_size=8, page_size=4)
    ahead.pop("_ahead")
    assert ahead == sync
    for i, rec in enumerate(sync.values()):
        n_out = len(rec["tokens"])
        start = [len(prompts[i]), 0, 3][i % 3]
        assert len(rec["lp"]) == len(prompts[i]) + n_out - start
        assert rec["lp_ids"][-n_out:] == rec["tokens"]


def test_abort_with_two_steps_in_flight_frees_everything():
    b, w = make()
    for i in range(4):
        b.submit(req(f"r{i}", prompt=list(range(10 + i, 30 + i)), max_new=40))
    out = run(b, w, overlap=True, abort_at={5: "r1", 9: "r2"})
    assert out["r1"]["finish"] == out["r2"]["finish"] == "abort"
    assert out["r0"]["finish"] == "length" and len(out["r0"]["tokens"]) == 40


def test_requests_ending_by_length_are_not_planned_ahead():
    b, w = make()
    b.submit(req("one", max_new=1))
    first = b.next_batch()
    assert b.next_batch() is None and not b.needs_result  # its only token is in flight
    b.complete(w.run(first))
    assert not b.has_work()
    assert_all_slots_back(b)


def test_memory_short_waits_for_the_result_instead_of_retracting_ahead():
    b, w = make(kv_slots=40, enable_cache=False, init_new_token_ratio=0.0, min_new_token_ratio=0.0)
    b.submit(req("a", prompt=list(range(20, 36)), max_new=20))
    b.submit(req("b", prompt=list(range(40, 56)), max_new=20))
    batch = b.next_batch()
    while batch is not None:
        batch, result = b.next_batch(), w.run(batch)
        if batch is None:
            assert b.needs_result  # only a retraction makes room: not while a step runs
            b.complete(result)
            break
        b.complete(result)
    assert b.next_batch() is not None and b.stats().retractions == 1


def test_a_prefill_in_flight_is_shared_with_the_next_step():
    b, w = make(page_size=4)
    doc = list(range(100, 164))
    b.submit(req("first", prompt=doc, max_new=4))
    first = b.next_batch()
    b.submit(req("second", prompt=doc + [7, 8, 9], max_new=4))
    ahead = b.next_batch()  # planned while the document's prefill runs
    assert ahead.rows[-1] != first.rows[0] and ahead.extend_lens[-1] == 3
    assert ahead.prefix_lens[-1] == 64 and ahead.new_rows[0].prefix_slots == first.out_slots
    for batch in (first, ahead):
        b.complete(w.run(batch))
    out = run(b, w, overlap=True)
    assert out["first"]["finish"] == out["second"]["finish"] == "length"
