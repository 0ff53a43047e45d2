"""Quiet requests: which ones are asked about, which answers look short, and which are lost:
short at one probe and still short, with nothing arrived, a whole wait later."""

from __future__ import annotations

import asyncio
import time

from opentelemetry.trace import INVALID_SPAN

from libs.protocol import Subjects
from libs.protocol.messages import StreamStatusReply, StreamStatusRequest, TextDelta
from services.gateway.generation import Generation
from services.gateway.stall import Arrivals, short_output


def _gen(rid: str, worker: str = "w1") -> Generation:
    gen = Generation(rid, worker, asyncio.Queue(), 5, INVALID_SPAN, 5.0, lambda g: None)
    gen.bound_at = time.monotonic() - 10
    return gen


def test_only_unfinished_requests_quiet_for_stall_s_are_asked_about():
    arrivals = Arrivals()
    quiet, busy, done = _gen("q"), _gen("b"), _gen("d")
    done.finished = True
    arrivals.note(TextDelta(rid="q", text="x", token_ids=[1, 2], pos=0))
    arrivals._seen["q"] = (time.monotonic() - 5, 2)  # its last output 5 s ago
    arrivals.note(TextDelta(rid="b", text="x", token_ids=[1], pos=0))
    assert [(g.rid, pos) for g, pos in arrivals.quiet([quiet, busy, done], 2.0)] == [("q", 2)]
    arrivals.forget("q")
    assert [(g.rid, pos) for g, pos in arrivals.quiet([quiet], 2.0)] == [("q", 0)]  # since it was bound


async def test_more_sent_than_arrived_or_not_held_looks_short(bus, subject_prefix):
    subjects = Subjects(subject_prefix)
    asked: list[list[str]] = []

    async def status(msg: StreamStatusRequest) -> StreamStatusReply:
        asked.append(msg.rids)
        return StreamStatusReply(sent=[{"a": 3, "b": 7, "c": -1}[rid] for rid in msg.rids])

    await bus.subscribe(subjects.sched_status("w1"), status, StreamStatusRequest)
    await bus.nc.flush()
    a, b, c, d = _gen("a"), _gen("b"), _gen("c"), _gen("d", worker="gone")
    short = await short_output(bus, subjects, [(a, 3), (b, 4), (c, 0), (d, 0)], timeout=1.0)
    assert sorted((g.rid, pos, sent) for g, pos, sent in short) == [("b", 4, 7), ("c", 0, -1)]
    assert asked == [["a", "b", "c"]]  # one request per worker; "gone" answers nothing


def test_only_what_stays_short_for_a_whole_wait_is_lost():
    arrivals = Arrivals()
    slow, lost, done = _gen("slow"), _gen("lost"), _gen("done")
    found = [(slow, 4, 7), (lost, 4, 7), (done, 0, -1)]
    assert arrivals.confirm(found, wait_s=3.0) == []  # first seen short: only noted
    arrivals.note(TextDelta(rid="slow", text="x", token_ids=[1, 2, 3], pos=4))  # it was only queued
    for rid in ("lost", "done"):
        when, sent = arrivals._suspect[rid]
        arrivals._suspect[rid] = (when - 4.0, sent)  # noted 4 s ago
    got = sorted((g.rid, why) for g, why in arrivals.confirm(found[1:], wait_s=3.0))
    assert got == [("done", "the scheduler no longer holds it and its end never arrived"),
                   ("lost", "3 tokens sent 4s ago never arrived")]
    assert "slow" not in arrivals._suspect
