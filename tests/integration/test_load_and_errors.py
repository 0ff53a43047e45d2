"""32 concurrent requests are batched; bad input gets OpenAI-style 4xx and changes nothing."""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"


async def test_32_concurrent_requests_are_batched(stack, stack_bus):
    (worker,) = (await stack_bus.workers()).workers
    before = await stack_bus.sched_stats(worker.worker_id)

    async def one(client, i):
        resp = await client.post("/v1/completions", json={
            "model": MODEL, "prompt": f"Request number {i}: the weather today is",
            "max_tokens": 12, "temperature": 0.7, "seed": i,
        })
        assert resp.status_code == 200, resp.text
        return resp.json()

    async with httpx.AsyncClient(base_url=stack.url, timeout=300) as client:
        outs = await asyncio.gather(*(one(client, i) for i in range(32)))
    assert all(o["usage"]["completion_tokens"] > 0 for o in outs)
    after = await stack_bus.sched_stats(worker.worker_id)
    assert after.requests_finished - before.requests_finished == 32
    assert after.max_batch_size >= 8, after.batch_size_hist
    assert after.running == 0 and after.waiting == 0
    # every KV slot came back: free, or held only by the prefix cache (evictable)
    assert after.free_slots + after.evictable_slots == worker.total_slots
    assert after.protected_slots == 0


BAD = [
    ("malformed json", "/v1/chat/completions", b"{not json", 400),
    ("missing messages", "/v1/chat/completions", {"model": MODEL}, 400),
    ("messages wrong type", "/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400),
    ("empty messages", "/v1/chat/completions", {"model": MODEL, "messages": []}, 400),
    ("max_tokens minus one", "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": -1}, 400),
    ("max_tokens negative", "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": -5}, 400),
    ("temperature wrong type", "/v1/completions",
     {"model": MODEL, "prompt": "a", "temperature": "hot"}, 400),
    ("unknown field wrong type", "/v1/completions",
     {"model": MODEL, "prompt": "a", "frequency_penalty": "lots"}, 400),
    ("unknown model", "/v1/chat/completions",
     {"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]}, 404),
    ("prompt too long", "/v1/completions",
     {"model": MODEL, "prompt": "hello " * 9000, "max_tokens": 4}, 400),
    ("generate without input", "/generate", {"sampling_params": {}}, 400),
    ("generate bad ids", "/generate", {"input_ids": [1, -4]}, 400),
]


@pytest.mark.parametrize("name,path,body,status", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_openai_error(stack, name, path, body, status):
    with httpx.Client(base_url=stack.url, timeout=120) as client:
        if isinstance(body, bytes):
            resp = client.post(path, content=body, headers={"content-type": "application/json"})
        else:
            resp = client.post(path, json=body)
        assert resp.status_code == status, resp.text
        err = resp.json()["error"]
        assert err["message"] and err["type"]
        ok = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
        assert ok.status_code == 200, ok.text
