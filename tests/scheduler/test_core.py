"""Continuous batching, prefix reuse, chunking and retraction, with a slot-reading worker."""

from __future__ import annotations

import random

import pytest

from libs.protocol import ServiceError
from libs.protocol.messages import ErrorInfo, SamplingParams, WorkerInfo
from services.scheduler.config import CoreConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.request import Req

from .slot_worker import SlotWorker

EOS = 2


def make(kv_slots=256, max_requests=16, host_slots=0, **cfg) -> tuple[SchedulerCore, SlotWorker]:
    info = WorkerInfo(worker_id="w1", model="m", kv_slots=kv_slots, max_requests=max_requests,
                      max_model_len=512, vocab_size=1000, eos_token_ids=[EOS], dtype="float32",
                      host_kv_slots=host_slots)
    return (SchedulerCore(info, CoreConfig(**cfg)),
            SlotWorker(kv_slots, max_requests, 512, host_slots=host_slots))


def req(rid, prompt=None, max_new=3, ns="", **sp) -> Req:
    return Req(rid=rid, input_ids=prompt or list(range(10, 14)), namespace=ns,
               sampling=SamplingParams(max_new_tokens=max_new, **sp), detok_instance="tok1")


def step(b: SchedulerCore, w: SlotWorker):
    batch = b.next_batch()
    assert batch is not None
    b.complete(w.run(batch))
    return batch


def run_deltas(b: SchedulerCore, w: SlotWorker, limit=10_000) -> list:
    """Step until no work is left; every delta, in order."""
    deltas = []
    for _ in range(limit):
        if not b.has_work():
            break
        batch = b.next_batch()
        if batch is not None:
            b.complete(w.run(batch))
        deltas += [d for _, d in b.take_deltas()]
    assert not b.has_work()
    return deltas


def drain(b: SchedulerCore, w: SlotWorker, limit=10_000) -> dict[str, list[int]]:
    outputs: dict[str, list[int]] = {}
    for d in run_deltas(b, w, limit):
        outputs.setdefault(d.rid, []).extend(d.token_ids)
    return outputs


def assert_all_slots_back(b: SchedulerCore):
    if b.host is not None:  # every host slot is free or held by a tree node
        held = sum(len(n.lower) for n in b.cache.tree._all_nodes() if n.lower is not None)
        assert b.host.num_free + held == b.info.host_kv_slots
    size = b.cache.tree.size_info() if b.cache.tree else None
    assert b.cache.available == b.info.kv_slots
    assert size is None or size.protected == 0
    assert b.rows.num_free == b.info.max_requests
    if b.cache.tree:
        b.cache.tree.check_integrity()


def test_requests_join_and_leave_the_running_batch():
    b, w = make(enable_cache=False)
    b.submit(req("a", max_new=3))
    first = step(b, w)
    assert first.extend_lens == [4] and first.prefix_lens == [0] and len(first.new_rows) == 1
    b.submit(req("b", prompt=[20, 21, 22, 23, 24], max_new=2))
    second = step(b, w)  # a decodes, b prefills in the same step
    assert second.extend_lens == [1, 5] and second.prefix_lens == [4, 0]
    third = step(b, w)
    assert third.extend_lens == [1, 1]
    finals = {d.rid: d for _, d in b.take_deltas() if d.finish_reason}
    assert finals["a"].finish_reason == "length" and finals["a"].completion_tokens == 3
    assert finals["b"].prompt_tokens == 5
    assert not b.has_work()
    assert_all_slots_back(b)
    assert dict(b.batch_sizes) == {1: 1, 2: 2}


def test_second_request_reuses_the_cached_prompt():
    b, w = make()
    doc = list(range(100, 140))
    b.submit(req("a", prompt=doc + [1, 2], max_new=2))
    first = step(b, w)
    b.submit(req("b", prompt=doc + [3, 4, 5], max_new=2))
    second = step(b, w)
    assert second.prefix_lens == [42, 40] and second.extend_lens == [1, 3]
    assert second.new_rows[0].prefix_slots == first.out_slots[:40]
    drain(b, w)
    assert b.stats().cached_tokens == 40
    assert_all_slots_back(b)


def test_requests_sharing_a_prompt_wait_for_one_prefill():
    b, w = make()
    doc = list(range(200, 300))
    for i in range(3):
        b.submit(req(f"r{i}", prompt=doc + [i + 1], max_new=2))
    first = step(b, w)
    assert first.extend_lens == [101]  # the two others wait for this prefix
    second = step(b, w)
    assert second.prefix_lens[1:] == [100, 100] and second.extend_lens[1:] == [1, 1]
    drain(b, w)
    assert_all_slots_back(b)


def test_chunked_prefill_runs_next_to_decodes():
    b, w = make(chunked_prefill_size=8)
    b.submit(req("short", max_new=5))
    step(b, w)
    b.submit(req("long", prompt=list(range(300, 320)), max_new=2))
    lens = [step(b, w).extend_lens for _ in range(3)]
    assert lens == [[1, 8], [1, 8], [1, 4]]
    deltas = [d for _, d in b.take_deltas() if d.rid == "long"]
    assert len(deltas) == 1  # only the last chunk samples a token


def run_workload(prompts, **cfg):
    b, w = make(**cfg)
    for i, p in enumerate(prompts):
        b.submit(req(f"r{i}", prompt=p, max_new=6 + i % 5))
    outputs = drain(b, w)
    assert_all_slots_back(b)
    return outputs, b.stats()


def branching_prompts(n, seed):
    rng = random.Random(seed)
    stems = [[rng.randrange(3, 900) for _ in range(rng.randrange(8, 40))] for _ in range(4)]
    prompts = []
    for _ in range(n):
        p = list(rng.choice(stems))
        for _ in range(rng.randrange(0, 3)):
            p += [rng.randrange(3, 900) for _ in range(rng.randrange(1, 12))]
        prompts.append(p)
    return prompts


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "dfs-weight"])
def test_small_pool_cache_and_retraction_keep_outputs(policy):
    prompts = branching_prompts(40, seed=7)
    reference, _ = run_workload(prompts, enable_cache=False, kv_slots=4096)
    out, stats = run_workload(prompts, kv_slots=160, max_requests=8, chunked_prefill_size=16,
                              schedule_policy=policy)
    assert out == reference
    assert stats.cached_tokens > 0
    forced, stats = run_workload(prompts, kv_slots=400, chunked_prefill_size=16,
                                 schedule_policy=policy, retract_interval=3)
    assert forced == reference and stats.retractions > 0


def test_optimistic_admission_retracts_and_resumes_with_the_same_output():
    prompts = branching_prompts(40, seed=7)
    reference, _ = run_workload(prompts, enable_cache=False, kv_slots=4096)
    out, stats = run_workload(prompts, kv_slots=120, max_requests=8, chunked_prefill_size=16,
                              init_new_token_ratio=0.0, min_new_token_ratio=0.0)
    assert out == reference and stats.retractions > 0


def test_admission_holds_back_when_memory_is_short():
    b, w = make(kv_slots=40, enable_cache=False, init_new_token_ratio=1.0)
    b.submit(req("a", prompt=list(range(20, 40)), max_new=10))
    b.submit(req("b", prompt=list(range(40, 50)), max_new=10))
    batch = step(b, w)
    assert len(batch.rows) == 1 and [r.rid for r in b.waiting] == ["b"]
    drain(b, w)
    assert_all_slots_back(b)


def test_abort_waiting_and_running_frees_everything():
    b, w = make(max_running_requests=1)
    b.submit(req("run", max_new=10))
    b.submit(req("wait", prompt=[7, 8, 9], max_new=10))
    step(b, w)
    assert b.abort("wait") and b.abort("run") and not b.abort("nope")
    assert b.next_batch() is None
    finals = {d.rid: d.finish_reason for _, d in b.take_deltas() if d.finish_reason}
    assert finals == {"run": "abort", "wait": "abort"}
    assert_all_slots_back(b)


def test_abort_during_forward_drops_the_token():
    b, w = make()
    b.submit(req("x", max_new=10))
    batch = b.next_batch()
    b.abort("x")
    b.complete(w.run(batch))
    (inst, final), = [d for d in b.take_deltas() if d[1].finish_reason]
    assert inst == "tok1" and final.finish_reason == "abort" and final.token_ids == []
    assert_all_slots_back(b)


def test_eos_and_stop_token_ids():
    b, w = make()
    r1, r2 = req("eos", max_new=10), req("ignore", prompt=[5, 6], max_new=2, ignore_eos=True)
    b.submit(r1)
    b.submit(r2)
    batch = b.next_batch()
    b.complete(type(w.run(batch))(step=batch.step, next_token_ids=[EOS, EOS], forward_ms=0))
    finals = {d.rid: d.finish_reason for _, d in b.take_deltas() if d.finish_reason}
    assert finals == {"eos": "stop"}
    b3 = req("stopid", prompt=[9, 9], max_new=10, stop_token_ids=[77])
    b.submit(b3)
    batch = b.next_batch()
    b.complete(type(w.run(batch))(step=batch.step, next_token_ids=[4, 77], forward_ms=0))
    finals = {d.rid: d.finish_reason for _, d in b.take_deltas() if d.finish_reason}
    assert finals == {"ignore": "length", "stopid": "stop"}


def test_namespaces_do_not_share():
    b, w = make()
    b.submit(req("a", prompt=list(range(30, 70)), ns="t1", max_new=1))
    drain(b, w)
    b.submit(req("b", prompt=list(range(30, 70)), ns="t2", max_new=1))
    b.submit(req("c", prompt=list(range(30, 70)), ns="t1", max_new=1))
    drain(b, w)
    assert b.stats().cached_tokens == 39  # only c hits (all but its last token)


def test_kv_events_are_numbered_per_epoch_and_flush_is_guarded():
    b, w = make()
    b.submit(req("a", prompt=list(range(30, 50)), max_new=2))
    step(b, w)
    first = b.take_events()
    assert first.seq == 0 and first.events[0].kind == "stored"
    drain(b, w)
    second = b.take_events()
    assert second.seq == len(first.events) and second.epoch == first.epoch
    b.submit(req("x"))
    with pytest.raises(ServiceError):
        b.flush_cache()
    drain(b, w)
    b.take_events()
    assert b.flush_cache() > 0
    cleared = b.take_events()
    assert cleared.events[-1].kind == "cleared" and cleared.epoch != first.epoch
    assert_all_slots_back(b)


def test_submit_validation_and_queue_limit():
    b, _ = make(kv_slots=16, max_queued_requests=1)
    with pytest.raises(ServiceError) as err:
        b.submit(req("big", prompt=list(range(10)), max_new=10))
    assert err.value.status == 400
    with pytest.raises(ServiceError):
        b.submit(req("bad", prompt=[1, 1000]))
    b.submit(req("q1"))
    with pytest.raises(ServiceError) as err:
        b.submit(req("q2"))
    assert err.value.status == 503 and err.value.code == "overloaded"
    with pytest.raises(ServiceError):
        b.submit(req("q1"))


def test_fail_all_reports_error_to_everyone():
    b, w = make()
    b.submit(req("a"))
    step(b, w)
    b.submit(req("b", prompt=[5, 5]))
    b.fail_all(ErrorInfo(code="worker_lost", message="gone", status=503))
    finals = [d for _, d in b.take_deltas() if d.finish_reason]
    assert {d.rid for d in finals} == {"a", "b"}
    assert all(d.finish_reason == "error" and d.error.code == "worker_lost" for d in finals)
    assert not b.has_work()


def test_seeded_requests_keep_their_seed():
    assert req("s", seed=1234).seed == 1234
    assert req("u").seed != req("v").seed


def test_queued_prefill_tokens_leave_out_the_cached_prefix():
    """A fork's branches waiting behind a held document add only their own suffixes:
    the load report must not make the worker holding the document look busy."""
    b, w = make()
    doc = list(range(100, 164))
    b.submit(req("hold", prompt=doc, max_new=1))
    drain(b, w)
    for i in range(3):
        b.submit(req(f"branch{i}", prompt=doc + [i + 1] * 8, max_new=2))
    cached = b.cache.prefix_len(b.waiting[0])
    assert cached >= 48
    assert b.queued_prefill_tokens() == 3 * (72 - cached)


def test_an_abort_that_overtakes_its_submit_refuses_it():
    """The gateway gave up on a submit (no reply in time) and aborted it; if the
    submit arrives after the abort, it is refused instead of computed for no one."""
    b, _ = make()
    assert not b.abort("late")
    with pytest.raises(ServiceError) as err:
        b.submit(req("late"))
    assert (err.value.code, err.value.status) == ("aborted", 409)
    b.submit(req("late"))  # remembered once: a later, real request with that id runs
    assert [r.rid for r in b.waiting] == ["late"]
