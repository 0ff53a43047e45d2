"""Limits: max_tokens cap, prompt size, concurrency (429), deadlines (408/504 / error event)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from services.gateway.app import create_app
from services.gateway.health import BusHealth, HealthReport
from services.gateway.limits import Deadline, Limits
from services.gateway.routes import GatewaySettings
from services.gateway.sse import parse_sse

MODEL = "served-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def _client(pipeline, **limits) -> httpx.AsyncClient:
    settings = GatewaySettings(MODEL, limits=Limits(**limits))
    app = create_app(pipeline, settings, BusHealth(pipeline.bus, pipeline.subjects))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw",
                             timeout=30)


def test_cap_max_tokens():
    limits = Limits(max_tokens_cap=10)
    assert limits.cap_max_tokens(None, "max_tokens") == 10
    assert limits.cap_max_tokens(None, "max_tokens", default=16) == 10
    assert limits.cap_max_tokens(None, "max_tokens", default=4) == 4
    assert limits.cap_max_tokens(10, "max_tokens") == 10
    with pytest.raises(Exception, match="max_tokens must be at most 10 on this server, got 11"):
        limits.cap_max_tokens(11, "max_tokens")
    assert Limits().cap_max_tokens(None, "max_tokens", default=16) == 16
    assert Limits().cap_max_tokens(10**6, "max_tokens") == 10**6


def test_deadline_never_extends_the_servers():
    def seen(limits: Limits, timeout: float | None) -> tuple[float | None, int]:
        deadline = limits.deadline(timeout)
        return deadline.seconds, deadline.error().status

    assert Limits().deadline(None).seconds is None
    assert seen(Limits(), 3.0) == (3.0, 408)  # the client's own timeout
    assert seen(Limits(request_deadline=5.0), None) == (5.0, 504)  # the server's
    assert seen(Limits(request_deadline=5.0), 60.0) == (5.0, 504)
    assert seen(Limits(request_deadline=5.0), 1.0) == (1.0, 408)


async def test_deadline_iterate_stops_waiting():
    async def slow():
        yield 1
        await asyncio.sleep(10)
        yield 2

    got = []
    with pytest.raises(Exception, match="deadline of 0.2s"):
        async for item in Deadline(0.2).iterate(slow()):
            got.append(item)
    assert got == [1]


async def test_without_a_deadline_iterate_passes_every_item_and_its_errors():
    async def items():
        yield 1
        await asyncio.sleep(0.01)
        yield 2
        raise ValueError("upstream")

    got = []
    with pytest.raises(ValueError, match="upstream"):
        async for item in Deadline(None).iterate(items()):
            got.append(item)
    assert got == [1, 2]


async def test_max_tokens_cap(pipeline, played):
    async with _client(pipeline, max_tokens_cap=8) as client:
        resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 9})
        assert resp.status_code == 400
        err = resp.json()["error"]
        assert err["param"] == "max_tokens" and "at most 8" in err["message"]
        resp = await client.post("/v1/chat/completions", json={**CHAT, "max_completion_tokens": 99})
        assert resp.json()["error"]["param"] == "max_completion_tokens"
        resp = await client.post("/generate", json={"text": "a", "sampling_params": {"max_new_tokens": 9}})
        assert resp.json()["error"]["param"] == "sampling_params.max_new_tokens"
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert (await client.post("/v1/completions", json={"model": MODEL, "prompt": "a"})).status_code == 200
        assert (await client.post("/generate", json={"text": "a"})).status_code == 200
    assert [e.max_new_tokens for e in played.encodes] == [8, 8, 8]


async def test_max_prompt_tokens(pipeline, played):
    async with _client(pipeline, max_prompt_tokens=4) as client:
        resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": [1, 2, 3, 4, 5]})
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "prompt_too_long"
        assert played.encodes == []  # token ids: refused before anything is sent
        # text: counted after encoding (the played tokenizer: a token per character)
        resp = await client.post("/generate", json={"text": "abcdef"})
        assert resp.status_code == 400 and "has 6 tokens" in resp.json()["error"]["message"]
        resp = await client.post("/generate", json={"text": "abcdef", "stream": True})
        assert resp.status_code == 400
        assert (await client.post("/generate", json={"text": "abcd"})).status_code == 200
    await played.wait_for(played.aborts, 2)  # the refused submissions were aborted


async def test_deadline_non_stream_408_504_and_abort(pipeline, played):
    played.mode = "hang"
    async with _client(pipeline, request_deadline=0.2) as client:
        started = time.monotonic()
        resp = await client.post("/v1/chat/completions", json={**CHAT, "timeout": 0.1})
        assert time.monotonic() - started < 2.0
        server = await client.post("/generate", json={"text": "a"})
    assert resp.status_code == 408
    err = resp.json()["error"]
    assert err["code"] == "timeout" and err["param"] == "timeout" and "0.1s" in err["message"]
    assert server.status_code == 504 and "server's deadline of 0.2s" in server.json()["error"]["message"]
    await played.wait_for(played.aborts)
    assert played.aborts[0].rid == played.submits[0].rid


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {**CHAT, "stream": True}),
    ("/generate", {"text": "a", "stream": True}),
])
async def test_deadline_stream_ends_with_error_event(pipeline, played, path, body):
    played.mode = "hang"
    async with _client(pipeline, request_deadline=0.3) as client:
        resp = await client.post(path, json=body)
    assert resp.status_code == 200
    events = parse_sse(resp.content)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "timeout"
    await played.wait_for(played.aborts)


async def test_concurrency_limit_429_with_retry_after(pipeline, played):
    played.mode = "hang"
    async with _client(pipeline, max_concurrent_requests=1) as client:
        first = asyncio.ensure_future(client.post("/generate", json={"text": "a", "timeout": 1.0}))
        await played.wait_for(played.submits)
        resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": "b"})
        assert resp.status_code == 429 and resp.headers["retry-after"] == "1"
        assert "limit 1" in resp.json()["error"]["message"]
        assert (await client.get("/health")).status_code in (200, 503)  # not counted
        assert (await first).status_code == 408
        played.mode = "finish"
        resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": "b"})
        assert resp.status_code == 200  # the slot came back


async def test_unhealthy_503_has_retry_after(pipeline):
    async def sick() -> HealthReport:
        return HealthReport(False, {"status": "unavailable"})

    app = create_app(pipeline, GatewaySettings(MODEL), sick)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
        resp = await c.get("/health")
    assert resp.status_code == 503 and resp.headers["retry-after"] == "1"


@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"model": "m", "prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    b'{"model": "m", "prompt": "\xff\xfe"}',
    b"",
])
async def test_deep_or_invalid_json_is_400(pipeline, body):
    async with _client(pipeline) as client:
        resp = await client.post("/v1/completions", content=body,
                                 headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["type"] == "invalid_request_error"
