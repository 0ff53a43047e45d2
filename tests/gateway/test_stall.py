"""Quiet requests: which ones are asked about, and which answers mean output was lost."""

from __future__ import annotations

import asyncio
import time

from opentelemetry.trace import INVALID_SPAN

from libs.protocol import Subjects
from libs.protocol.messages import StreamStatusReply, StreamStatusRequest, TextDelta
from services.gateway.generation import Generation
from services.gateway.stall import Arrivals, lost_output


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


async def test_more_sent_than_arrived_or_not_held_means_lost(bus, subject_prefix):
    subjects = Subjects(subject_prefix)
    asked: list[list[str]] = []

    async def status(msg: StreamStatusRequest) -> StreamStatusReply:
        asked.append(msg.rids)
        return StreamStatusReply(sent=[{"a": 3, "b": 7, "c": -1}[rid] for rid in msg.rids])

    await bus.subscribe(subjects.sched_status("w1"), status, StreamStatusRequest)
    await bus.nc.flush()
    a, b, c, d = _gen("a"), _gen("b"), _gen("c"), _gen("d", worker="gone")
    lost = await lost_output(bus, subjects, [(a, 3), (b, 4), (c, 0), (d, 0)], timeout=1.0)
    assert sorted((g.rid, why) for g, why in lost) == [
        ("b", "3 tokens sent never arrived"), ("c", "the scheduler no longer holds it")]
    assert asked == [["a", "b", "c"]]  # one request per worker; "gone" answers nothing
