"""A generation's numbered deltas: repeats dropped, a gap resumes the request from the last
token the consumer got (deltas before the gap go out first)."""

from __future__ import annotations

import asyncio

from opentelemetry.trace import INVALID_SPAN

from libs.protocol.messages import TextDelta
from services.gateway.generation import Generation


def _gen(resubmits: list) -> tuple[Generation, asyncio.Queue]:
    queue: asyncio.Queue = asyncio.Queue()
    gen = Generation("r", "w", queue, 10, INVALID_SPAN, 5.0, lambda g: None)
    fresh: asyncio.Queue = asyncio.Queue()

    async def resubmit(g, worker, exclude, code):
        resubmits.append((worker, exclude, code, list(g.output_ids)))
        g.rebind("r2", worker, fresh)
        fresh.put_nowait(TextDelta(rid="r2", text=" c", token_ids=[3], finish_reason="length", pos=2))

    gen.enable_retry(object(), resubmit)
    return gen, queue


async def test_a_repeat_is_dropped_and_a_gap_resumes_after_what_went_out():
    resubmits: list = []
    gen, queue = _gen(resubmits)
    for delta in (TextDelta(rid="r", text="a", token_ids=[1], pos=0),
                  TextDelta(rid="r", text="a", token_ids=[1], pos=0),  # a repeat
                  TextDelta(rid="r", text=" b", token_ids=[2], pos=1),
                  TextDelta(rid="r", text=" d", token_ids=[4], pos=3)):  # token 2 was lost
        queue.put_nowait(delta)
    texts = [d.text async for d in gen]
    assert "".join(texts) == "a b c" and gen.output_ids == [1, 2, 3]
    assert resubmits == [("w", False, "stream_gap", [1, 2])]  # the same worker, from 2 tokens
    assert gen.finish_reason == "length" and gen.blips == 1 and gen.retries == 0
