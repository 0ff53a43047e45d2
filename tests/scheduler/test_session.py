"""Resumed submissions: the replayed output counts as output, and the request
continues exactly as an undisturbed one would. A constrained submission
announces its pattern to the worker."""

from __future__ import annotations

import asyncio
import time

import pytest

from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.messages import PrepareRegex, SamplingParams, SubmitRequest, WorkerInfo
from services.scheduler.config import CoreConfig
from services.scheduler.request import Req
from services.scheduler.session import WorkerSession, _split_resumed

from .test_core import drain, make


def submit(ids, n, max_new=8) -> SubmitRequest:
    return SubmitRequest(rid="r", input_ids=ids, sampling=SamplingParams(max_new_tokens=max_new),
                         detok_instance="tok1", num_output_tokens=n)


def test_split_resumed():
    assert _split_resumed(submit([5, 6, 7], 0), 1000) == ([5, 6, 7], [])
    assert _split_resumed(submit([5, 6, 7, 8], 2), 1000) == ([5, 6], [7, 8])
    for bad in (submit([5, 6], 2), submit([5, 6], -1), submit([5, 6, 7], 2, max_new=2),
                submit([5, 6, 1000], 1)):
        with pytest.raises(ServiceError) as err:
            _split_resumed(bad, 1000)
        assert err.value.status == 400


@pytest.mark.parametrize("cached", [False, True])
def test_a_resumed_request_continues_like_an_undisturbed_one(cached):
    prompt = list(range(10, 30))
    b, w = make(page_size=4)
    b.submit(Req(rid="a", input_ids=prompt, sampling=SamplingParams(max_new_tokens=12),
                 detok_instance="tok1"))
    full = drain(b, w)["a"]
    assert len(full) == 12
    if not cached:  # a worker that never saw the prompt
        b, w = make(page_size=4)
    for k in (1, 5, 11):
        p, out = _split_resumed(submit(prompt + full[:k], k, max_new=12), 1000)
        b.submit(Req(rid=f"r{k}", input_ids=p, sampling=SamplingParams(max_new_tokens=12),
                     detok_instance="tok1", output_ids=out))
        deltas = []
        while b.has_work():
            batch = b.next_batch()
            if batch is not None:
                b.complete(w.run(batch))
            deltas += [d for _, d in b.take_deltas()]
        assert [t for d in deltas for t in d.token_ids] == full[k:]
        last = deltas[-1]
        assert last.finish_reason == "length"
        assert (last.prompt_tokens, last.completion_tokens) == (len(prompt), 12)


async def test_a_constrained_submit_announces_its_pattern_to_the_worker(nats_server, subject_prefix):
    bus = await Bus.connect(nats_server.url, "test-session")
    subjects = Subjects(subject_prefix)
    info = WorkerInfo(worker_id="w1", model="m", kv_slots=256, max_requests=4, max_model_len=512,
                      vocab_size=1000, eos_token_ids=[2], dtype="float32")
    seen: list[PrepareRegex] = []

    async def record(msg: PrepareRegex) -> None:
        seen.append(msg)

    await bus.subscribe(subjects.worker_prepare("w1"), record, PrepareRegex)
    session = WorkerSession(bus, subjects, "s1", info, CoreConfig(), lease_s=5.0, forward_timeout=5.0)
    try:
        await session._on_submit(SubmitRequest(rid="free", input_ids=[5, 6], detok_instance="t",
                                               sampling=SamplingParams(max_new_tokens=4)))
        await session._on_submit(SubmitRequest(rid="re", input_ids=[5, 6], detok_instance="t",
                                               sampling=SamplingParams(max_new_tokens=4, regex="[0-9]+")))
        with pytest.raises(ServiceError):  # refused: nothing to announce
            await session._on_submit(SubmitRequest(rid="bad", input_ids=[5], detok_instance="t",
                                                   sampling=SamplingParams(max_new_tokens=4, regex="(")))
        await bus.nc.flush()
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert [m.patterns for m in seen] == [["[0-9]+"]]
    finally:
        await bus.close()


async def test_a_decode_worker_prefills_short_prompts_itself(nats_server, subject_prefix):
    """Conditional disaggregation: only a prompt with at least remote_prefill_min_tokens
    uncached tokens goes to the prefill worker named by the router."""
    from libs.protocol.messages import PrefillAck, PrefillRequest

    bus = await Bus.connect(nats_server.url, "test-session")
    subjects = Subjects(subject_prefix)
    info = WorkerInfo(worker_id="d1", model="m", kv_slots=512, max_requests=4, max_model_len=512,
                      vocab_size=1000, eos_token_ids=[2], dtype="float32", role="decode", kv_layout="L")
    asked: list[PrefillRequest] = []

    async def prefill(msg: PrefillRequest) -> PrefillAck:
        asked.append(msg)
        return PrefillAck(queue_position=0)

    await bus.subscribe(subjects.sched_prefill("p1"), prefill, PrefillRequest)
    session = WorkerSession(bus, subjects, "s1", info, CoreConfig(remote_prefill_min_tokens=50),
                            lease_s=5.0, forward_timeout=5.0)
    core = session.driver.core
    try:
        for rid, n in (("short", 20), ("long", 120)):
            await session._on_submit(SubmitRequest(rid=rid, input_ids=list(range(10, 10 + n)), detok_instance="t",
                                                   sampling=SamplingParams(max_new_tokens=4), prefill_worker="p1"))
        for _ in range(200):
            if asked:
                break
            await asyncio.sleep(0.01)
        assert [m.rid for m in asked] == ["long"] and asked[0].skip == 0 and asked[0].kv_layout == "L"
        assert [r.rid for r in core.waiting] == ["short"]  # prefilled here, as any request
        assert list(core.decode.pending.values())[0].rid == "long"
    finally:
        session.link.close()
        await bus.close()


async def _until(cond, tries=500):
    for _ in range(tries):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met")


async def test_an_overdue_transfer_asks_the_prefill_worker_before_prefilling_itself(nats_server, subject_prefix):
    """Through the broker: the decode session probes (PrefillStatus) a transfer past its
    deadline; the prefill session, which still queues it, answers and the deadline is
    renewed; once the prefill side no longer knows it, the decode side prefills itself."""
    from libs.protocol.messages import PrefillRequest, PrefillStatus

    bus = await Bus.connect(nats_server.url, "test-session")
    subjects = Subjects(subject_prefix)

    def info(w, role):
        return WorkerInfo(worker_id=w, model="m", kv_slots=512, max_requests=4, max_model_len=512,
                          vocab_size=1000, eos_token_ids=[2], dtype="float32", role=role, kv_layout="L")

    # the prefill session's handlers only (not started: it never steps, the request stays queued)
    p = WorkerSession(bus, subjects, "s2", info("p1", "prefill"), CoreConfig(), lease_s=5.0, forward_timeout=5.0)
    await bus.subscribe(subjects.sched_prefill("p1"), p.link.on_prefill, PrefillRequest)
    await bus.subscribe(subjects.sched_prefill_status("p1"), p.link.on_prefill_status, PrefillStatus)
    d = WorkerSession(bus, subjects, "s1", info("d1", "decode"), CoreConfig(remote_prefill_min_tokens=50),
                      lease_s=5.0, forward_timeout=5.0)
    book = d.driver.core.decode
    try:
        await d._on_submit(SubmitRequest(rid="long", input_ids=list(range(10, 130)), detok_instance="t",
                                         sampling=SamplingParams(max_new_tokens=4), prefill_worker="p1"))
        await _until(lambda: len(p.driver.core.waiting) == 1)
        (req,) = book.pending.values()
        req.transfer.sent_at = time.monotonic() - book.deadline_s(req) - 0.01  # just past its deadline
        d.link._expire()
        await _until(lambda: book.renewals == 1 and not req.transfer.probing)
        assert list(book.pending.values()) == [req] and not book.failures
        assert req.transfer.predicted_s == pytest.approx(120 / 500.0)  # 120 tokens at the default rate
        p.driver.abort(req.transfer.transfer_id, "abort")  # the prefill side forgets it
        req.transfer.renewed_at = 1.0
        d.link._expire()
        await _until(lambda: not book.pending)
        assert book.failures == {"deadline": 1} and book.renewals == 1
        assert [r.rid for r in d.driver.core.waiting] == ["long"]  # prefilled here
        assert d.driver.core.stats().kv_transfer_renewals == 1
    finally:
        d.link.close()
        p.link.close()
        await bus.close()


async def test_a_prefill_worker_that_never_steps_is_given_up_on_and_cancelled(nats_server, subject_prefix):
    """Through the broker: the prefill session answers "queued" but completes no step
    (its worker hung): renewed once, then ``stalled``; the decode side prefills itself
    and its abort reaches the prefill session, which drops its copy."""
    from libs.protocol.messages import AbortRequest, PrefillRequest, PrefillStatus

    bus = await Bus.connect(nats_server.url, "test-session")
    subjects = Subjects(subject_prefix)

    def info(w, role):
        return WorkerInfo(worker_id=w, model="m", kv_slots=512, max_requests=4, max_model_len=512,
                          vocab_size=1000, eos_token_ids=[2], dtype="float32", role=role, kv_layout="L")

    p = WorkerSession(bus, subjects, "s2", info("p1", "prefill"), CoreConfig(), lease_s=5.0, forward_timeout=5.0)
    await bus.subscribe(subjects.sched_prefill("p1"), p.link.on_prefill, PrefillRequest)
    await bus.subscribe(subjects.sched_prefill_status("p1"), p.link.on_prefill_status, PrefillStatus)
    await bus.subscribe(subjects.sched_abort("p1"), p._on_abort, AbortRequest)
    d = WorkerSession(bus, subjects, "s1", info("d1", "decode"), CoreConfig(remote_prefill_min_tokens=50),
                      lease_s=5.0, forward_timeout=5.0)
    book = d.driver.core.decode
    try:
        await d._on_submit(SubmitRequest(rid="long", input_ids=list(range(10, 130)), detok_instance="t",
                                         sampling=SamplingParams(max_new_tokens=4), prefill_worker="p1"))
        await _until(lambda: len(p.driver.core.waiting) == 1)
        (req,) = book.pending.values()
        t = req.transfer
        t.sent_at = time.monotonic() - book.deadline_s(req) - 0.01
        d.link._expire()
        await _until(lambda: book.renewals == 1 and not t.probing)
        t.renewed_at -= book.deadline_s(req) + 0.01  # the renewed deadline passes: still no step
        d.link._expire()
        await _until(lambda: not book.pending)
        assert book.failures == {"stalled": 1} and book.renewals == 1
        assert [r.rid for r in d.driver.core.waiting] == ["long"]  # prefilled here
        await _until(lambda: not p.driver.core.waiting)  # the prefill side's copy is gone
    finally:
        d.link.close()
        p.link.close()
        await bus.close()
