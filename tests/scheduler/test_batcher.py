"""Continuous batching bookkeeping; the test plays the worker by choosing tokens."""

import numpy as np
import pytest

from libs.protocol import ServiceError
from libs.protocol.messages import ErrorInfo, ForwardResult, SamplingParams, WorkerInfo
from services.scheduler.batcher import Batcher, BatcherConfig
from services.scheduler.request import Req

EOS = 2


def make(kv_slots=64, max_requests=8, **cfg) -> Batcher:
    info = WorkerInfo(worker_id="w1", model="m", kv_slots=kv_slots, max_requests=max_requests,
                      max_model_len=128, vocab_size=100, eos_token_ids=[EOS], dtype="float32")
    return Batcher(info, BatcherConfig(**cfg))


def req(rid, n_prompt=4, max_new=3, **sp) -> Req:
    return Req(rid=rid, input_ids=list(range(10, 10 + n_prompt)),
               sampling=SamplingParams(max_new_tokens=max_new, **sp), detok_instance="tok1")


def step(b: Batcher, tokens):
    batch = b.next_batch()
    assert batch is not None
    b.complete(ForwardResult(step=batch.step, next_token_ids=tokens[: len(batch.rows)],
                             forward_ms=1.0))
    return batch


def test_requests_join_and_leave_the_running_batch():
    b = make()
    b.submit(req("a", max_new=3))
    first = step(b, [50])
    assert first.extend_lens == [4] and first.prefix_lens == [0] and len(first.new_rows) == 1
    b.submit(req("b", n_prompt=5, max_new=2))
    second = step(b, [51, 60])  # a decodes, b prefills in the same step
    assert second.extend_lens == [1, 5] and second.prefix_lens == [4, 0]
    assert second.input_ids[0] == 50
    third = step(b, [52, 61])  # a hits max_new (length), b hits its limit too
    assert third.extend_lens == [1, 1]
    deltas = b.take_deltas()
    finals = {d.rid: d for _, d in deltas if d.finish_reason}
    assert finals["a"].finish_reason == "length" and finals["a"].completion_tokens == 3
    assert finals["b"].finish_reason == "length" and finals["b"].prompt_tokens == 5
    assert not b.has_work()
    assert b.slots.num_free == 64 and b.rows.num_free == 8
    assert dict(b.batch_sizes) == {1: 1, 2: 2}


def test_out_slots_are_distinct_and_follow_the_table():
    b = make()
    for i in range(3):
        b.submit(req(f"r{i}", n_prompt=3 + i, max_new=5))
    batch = step(b, [20, 21, 22])
    assert len(set(batch.out_slots)) == len(batch.out_slots) == 3 + 4 + 5
    batch2 = step(b, [23, 24, 25])
    assert not set(batch2.out_slots) & set(batch.out_slots)


def test_eos_and_stop_token_ids_finish_with_stop():
    b = make()
    b.submit(req("eos", max_new=10))
    b.submit(req("stopid", max_new=10, stop_token_ids=[77]))
    b.submit(req("ignore", max_new=2, ignore_eos=True))
    step(b, [EOS, 77, EOS])
    finals = {d.rid: d.finish_reason for _, d in b.take_deltas() if d.finish_reason}
    assert finals == {"eos": "stop", "stopid": "stop"}
    step(b, [EOS])
    finals = {d.rid: d.finish_reason for _, d in b.take_deltas() if d.finish_reason}
    assert finals == {"ignore": "length"}


def test_admission_reserves_future_tokens():
    b = make(kv_slots=20)
    b.submit(req("a", n_prompt=4, max_new=10))  # needs 14
    b.submit(req("b", n_prompt=4, max_new=4))   # needs 8 > 20 - 14
    batch = step(b, [30])
    assert batch.rows and len(batch.rows) == 1 and len(b.waiting) == 1
    for _ in range(9):
        step(b, [31])
    assert not b.running and [r.rid for r in b.waiting] == ["b"]  # a finished by length
    batch = step(b, [32])  # b admitted once a's reservation is gone
    assert batch.extend_lens == [4] and [r.rid for r in b.running] == ["b"]
    assert b.slots.num_free + sum(len(r.all_slots()) for r in b.running) == 20


def test_abort_waiting_and_running_frees_everything():
    b = make(max_running_requests=1)
    b.submit(req("run", max_new=10))
    b.submit(req("wait", max_new=10))
    step(b, [40])
    assert b.abort("wait") and b.abort("run") and not b.abort("nope")
    assert b.next_batch() is None
    finals = {d.rid: d.finish_reason for _, d in b.take_deltas() if d.finish_reason}
    assert finals == {"run": "abort", "wait": "abort"}
    assert b.slots.num_free == 64 and b.rows.num_free == 8


def test_abort_during_forward_drops_the_token():
    b = make()
    b.submit(req("x", max_new=10))
    batch = b.next_batch()
    b.abort("x")
    b.complete(ForwardResult(step=batch.step, next_token_ids=[5], forward_ms=1))
    (inst, final), = [d for d in b.take_deltas() if d[1].finish_reason]
    assert inst == "tok1" and final.finish_reason == "abort" and final.token_ids == []
    assert b.slots.num_free == 64


def test_submit_validation_and_queue_limit():
    b = make(kv_slots=16, max_queued_requests=1)
    with pytest.raises(ServiceError) as err:
        b.submit(req("big", n_prompt=10, max_new=10))
    assert err.value.status == 400
    with pytest.raises(ServiceError):
        b.submit(Req(rid="bad", input_ids=[1, 1000], sampling=SamplingParams(max_new_tokens=1),
                     detok_instance="t"))
    b.submit(req("q1"))
    with pytest.raises(ServiceError) as err:
        b.submit(req("q2"))
    assert err.value.status == 503 and err.value.code == "overloaded"
    with pytest.raises(ServiceError):
        b.submit(req("q1"))


def test_fail_all_reports_error_to_everyone():
    b = make()
    b.submit(req("a"))
    step(b, [3])
    b.submit(req("b"))
    b.fail_all(ErrorInfo(code="worker_lost", message="gone", status=503))
    finals = [d for _, d in b.take_deltas() if d.finish_reason]
    assert {d.rid for d in finals} == {"a", "b"}
    assert all(d.finish_reason == "error" and d.error.code == "worker_lost" for d in finals)
    assert b.slots.num_free == 64 and not b.has_work()


def test_seeded_requests_keep_their_seed():
    r = req("s", seed=1234)
    assert r.seed == 1234
    assert req("u").seed != req("v").seed
    assert np.asarray(r.all_slots()).size == 0
