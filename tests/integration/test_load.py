"""200 concurrent streaming requests through the real stack: each ends with exactly
one terminal event, and after the drain every KV slot is back."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from libs.protocol import Bus, Subjects
from libs.protocol.messages import FlushReply, FlushRequest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
N = 200


async def one(client: httpx.AsyncClient, i: int) -> dict:
    """Stream one request; count its terminal events (finish chunks, error events)."""
    body = {"model": MODEL, "prompt": f"Note {i}: the best thing about number {i} is",
            "max_tokens": 6, "temperature": 0.8, "seed": i, "stream": True}
    out = {"status": 0, "finishes": 0, "errors": 0, "done": 0, "after_terminal": 0, "text": ""}
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        out["status"] = resp.status_code
        if resp.status_code != 200:  # refused up front (e.g. 429/503): one error answer
            out["errors"] = 1 if "error" in json.loads(await resp.aread()) else 0
            return out
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out["done"] += 1
                continue
            if out["finishes"] or out["errors"]:
                out["after_terminal"] += 1
            event = json.loads(line[6:])
            if "error" in event:
                out["errors"] += 1
                continue
            choice = event["choices"][0]
            out["text"] += choice.get("text", "")
            out["finishes"] += choice.get("finish_reason") is not None
    return out


async def test_200_concurrent_streams_end_once_and_free_every_slot(stack, stack_bus):
    (worker,) = (await stack_bus.workers()).workers
    start = await stack_bus.sched_stats(worker.worker_id)
    assert start.running == 0 and start.waiting == 0
    limits = httpx.Limits(max_connections=N + 10, max_keepalive_connections=N + 10)
    began = time.monotonic()
    async with httpx.AsyncClient(base_url=stack.url, timeout=300, limits=limits) as client:
        results = await asyncio.gather(*(one(client, i) for i in range(N)))
    took = time.monotonic() - began

    for r in results:
        assert r["finishes"] + r["errors"] == 1, r  # exactly one terminal event
        assert r["after_terminal"] == 0, r
        assert r["status"] != 200 or r["done"] == 1, r  # then [DONE]
    ok = sum(r["finishes"] for r in results)
    assert ok == N, [r for r in results if not r["finishes"]][:3]

    end = await stack_bus.sched_stats(worker.worker_id)
    assert end.running == 0 and end.waiting == 0 and end.protected_slots == 0
    assert end.requests_finished - start.requests_finished == N
    # every slot is free or held only by the prefix cache (evictable) ...
    assert end.free_slots + end.evictable_slots == start.free_slots + start.evictable_slots
    assert end.free_slots + end.evictable_slots == worker.total_slots
    # ... and a flush returns the cached ones: the free count is back to the total
    bus = await Bus.connect(stack.nats_url, "load-test")
    try:
        subjects = Subjects(stack.config.subject_prefix)
        await bus.request(subjects.sched_flush(worker.worker_id), FlushRequest(), FlushReply)
    finally:
        await bus.close()
    flushed = await stack_bus.sched_stats(worker.worker_id)
    assert flushed.free_slots == worker.total_slots
    print(f"\nload: {N} concurrent streams in {took:.1f}s, max batch {end.max_batch_size}")
