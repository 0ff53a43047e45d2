"""A transfer past its deadline: the decode side asks the prefill side first
(PrefillStatus) and renews the deadline while the peer still has the request and
progresses; it prefills itself when the peer does not answer, fails or does not know
it (``deadline``), or answers without progress or past the total wait (``stalled``).
The two cores of test_disagg's Pair, the test acting as the bus."""

from __future__ import annotations

import asyncio
import time

import pytest

from libs.protocol import ServiceError
from libs.protocol.messages import PrefillStatus, PrefillStatusReply
from services.scheduler.disagg_probe import MAX_WAIT_DEADLINES, prefill_status, probe

from .test_core import assert_all_slots_back
from .test_disagg import Pair, colocated, request

TPS = 1000.0


def overdue(pair: Pair, rid: str, prompt, max_new=3):
    """Submit ``rid`` and let its PrefillRequest reach P; its deadline then passes."""
    req = request(rid, prompt, max_new=max_new)
    pair.submit(req)
    pair.bus()
    req.transfer.sent_at = time.monotonic() - pair.d.decode.deadline_s(req) - 0.01  # NOTE: just past it
    return req


def lapse(pair: Pair, req) -> None:
    """The renewed deadline passes too."""
    req.transfer.renewed_at -= pair.d.decode.deadline_s(req) + 0.01


def answer(pair: Pair):
    async def ask(msg: PrefillStatus) -> PrefillStatusReply:
        return prefill_status(pair.p, msg.transfer_id, TPS)
    return ask


def test_a_queued_transfer_past_its_deadline_is_renewed_not_fallen_back():
    pair = Pair()
    prompt = list(range(10, 70))
    req = overdue(pair, "a", prompt)
    book = pair.d.decode
    assert book.expired(time.monotonic()) == [req]
    assert asyncio.run(probe(book, req, answer(pair))) == ""
    assert book.renewals == 1 and req.transfer.renewed_at > req.transfer.sent_at
    assert req.transfer.predicted_s == pytest.approx(60 / TPS)  # the fresh prediction: its 60 tokens
    assert book.expired(req.transfer.renewed_at + 0.5) == []  # runs again from the renewal
    assert pair.run() == colocated([request("a", prompt, max_new=3)])
    assert not book.failures and book.received == 1 and pair.d.stats().kv_transfer_renewals == 1
    assert_all_slots_back(pair.d)
    assert_all_slots_back(pair.p)


def test_one_probe_at_a_time_per_transfer():
    pair = Pair()
    req = overdue(pair, "a", list(range(10, 70)))
    book, gate = pair.d.decode, asyncio.Event()

    async def slow(msg):
        await gate.wait()
        return await answer(pair)(msg)

    async def main():
        task = asyncio.ensure_future(probe(book, req, slow))
        await asyncio.sleep(0)
        assert book.expired(time.monotonic()) == []  # being probed: not expired again
        gate.set()
        return await task

    assert asyncio.run(main()) == "" and book.renewals == 1


async def _hang(msg):
    await asyncio.Event().wait()


async def _timeout(msg):
    raise ServiceError("timeout", "no responders")


async def _unknown(msg):
    return PrefillStatusReply(state="unknown")


@pytest.mark.parametrize("ask", [_hang, _timeout, _unknown], ids=["silent", "error", "unknown"])
def test_a_peer_that_does_not_answer_or_know_it_is_fallen_back(ask):
    pair = Pair()
    prompt = list(range(10, 70))
    req = overdue(pair, "a", prompt)
    book = pair.d.decode
    # a silent peer costs the probe's timeout at most: asyncio.wait_for ends it
    assert asyncio.run(probe(book, req, ask, timeout_s=0.05)) == "deadline"
    assert book.renewals == 0 and not req.transfer.probing
    assert book.expired(time.monotonic()) == [req]  # still overdue: the caller falls back
    book.fall_back(req, "deadline")
    assert pair.run() == colocated([request("a", prompt, max_new=3)])
    assert book.failures == {"deadline": 1}
    assert_all_slots_back(pair.d)


def test_a_transfer_settled_during_the_probe_is_left_alone():
    pair = Pair()
    req = overdue(pair, "a", list(range(10, 70)))
    book = pair.d.decode

    async def abort_then_answer(msg):
        pair.d.abort("a")
        return PrefillStatusReply(state="unknown")

    assert asyncio.run(probe(book, req, abort_then_answer)) == ""  # nothing left to fall back
    assert book.renewals == 0 and not book.failures


def test_the_prefill_side_says_queued_running_sending_or_unknown():
    pair = Pair(chunked_prefill_size=32)
    for rid, n in (("a", 100), ("b", 40)):
        pair.submit(request(rid, [rid == "a" and 5 or 6] + list(range(200, 200 + n - 1))))
    pair.bus()
    p = pair.p
    assert prefill_status(p, "t-a", TPS) == PrefillStatusReply(state="queued", predicted_s=0.1)
    # b waits behind a: a's 100 tokens and its own 40 (b shares none of a's prefix: first token)
    assert prefill_status(p, "t-b", TPS) == PrefillStatusReply(state="queued", predicted_s=0.14)
    batch = p.next_batch()  # a's first chunk of 32, in flight: still to compute
    assert prefill_status(p, "t-a", TPS) == PrefillStatusReply(state="running", predicted_s=0.1)
    p.complete(pair.pw.run(batch))
    assert prefill_status(p, "t-a", TPS) == PrefillStatusReply(
        state="running", predicted_s=0.068, completed_steps=1)
    assert prefill_status(p, "t-b", TPS).state == "queued"
    while not p.prefill.sampled:
        p.complete(pair.pw.run(p.next_batch()))
    assert prefill_status(p, "t-a", TPS).state == "sending"
    pre = p.prefill.take()[0]
    assert prefill_status(p, "t-a", TPS).state == "sending"  # taken: its KV on the way
    p.prefill.end(pre)
    assert prefill_status(p, "t-a", TPS).state == "unknown"  # handed off: not here any more
    assert prefill_status(p, "t-nope", TPS).state == "unknown"


def test_a_prefill_worker_hung_mid_step_is_renewed_once_then_stalled():
    """Its scheduler answers "running" and completes no step: the second probe finds no
    progress; the decode side prefills here and cancels the prefill side's copy."""
    pair = Pair()
    prompt = list(range(10, 70))
    req = overdue(pair, "a", prompt)
    book, p = pair.d.decode, pair.p
    hung = p.next_batch()  # the step is sent; its result never comes (for now)
    assert asyncio.run(probe(book, req, answer(pair))) == ""
    assert req.transfer.predicted_s == pytest.approx(60 / TPS)  # the step in flight counts
    lapse(pair, req)
    assert book.expired(time.monotonic()) == [req]
    assert asyncio.run(probe(book, req, answer(pair))) == "stalled"
    assert book.renewals == 1
    book.fall_back(req, "stalled")
    pair.bus()  # the cancel reaches the prefill side
    (pre,) = p.running
    assert pre.aborted
    p.complete(pair.pw.run(hung))  # NOTE: the worker recovers: the aborted copy is freed
    assert pair.run() == colocated([request("a", prompt, max_new=3)])
    assert book.failures == {"stalled": 1} and pair.d.stats().kv_transfer_failures == {"stalled": 1}
    assert_all_slots_back(pair.d)
    assert_all_slots_back(pair.p)


def test_a_prefill_worker_that_completes_steps_is_renewed_again():
    pair = Pair(chunked_prefill_size=16)
    req = overdue(pair, "a", list(range(10, 70)))
    book, p = pair.d.decode, pair.p
    for _ in range(3):  # queued, then running chunk after chunk: each answer shows progress
        assert asyncio.run(probe(book, req, answer(pair))) == ""
        p.complete(pair.pw.run(p.next_batch()))
        lapse(pair, req)
    assert book.renewals == 3 and not book.failures
    assert req.transfer.seen == (1, 2)  # running, two steps completed at the last answer


def test_the_total_wait_is_bounded_however_the_peer_answers():
    """A peer that always reports progress (and a long prediction) is still given up on
    MAX_WAIT_DEADLINES first deadlines after the PrefillRequest, without asking it again."""
    pair = Pair()
    req = overdue(pair, "a", list(range(10, 70)))
    book, t, asked = pair.d.decode, req.transfer, []
    first = book.deadline_s(req)

    async def progressing(msg):
        asked.append(msg)
        return PrefillStatusReply(state="running", predicted_s=1000.0, completed_steps=len(asked))

    assert asyncio.run(probe(book, req, progressing)) == ""
    assert t.max_wait_s == pytest.approx(MAX_WAIT_DEADLINES * first)
    assert book.deadline_s(req) > 3000  # renewed far out, but due at the bound
    assert book.expired(t.sent_at + t.max_wait_s - 0.01) == []
    assert book.expired(t.sent_at + t.max_wait_s + 0.01) == [req]
    t.sent_at -= t.max_wait_s  # the bound has passed
    assert asyncio.run(probe(book, req, progressing)) == "stalled" and len(asked) == 1
