"""A real uvicorn server: client disconnects abort, and the process stops on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
import pytest

from libs.protocol.service import CommonConfig, ServiceContext
from services.gateway.app import create_app
from services.gateway.health import BusHealth
from services.gateway.pipeline import PipelineConfig
from services.gateway.routes import GatewaySettings
from services.gateway.server import ServerConfig, serve_http
from services.gateway.sse import parse_sse

MODEL = "served-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@asynccontextmanager
async def running_server(pipeline):
    config = CommonConfig("unused", pipeline.subjects.prefix, pipeline.instance, "WARNING")
    async with AsyncExitStack() as stack:
        ctx = ServiceContext("gateway", config, pipeline.bus, asyncio.Event(), stack)
        app = create_app(pipeline, GatewaySettings(MODEL), BusHealth(pipeline.bus, pipeline.subjects))
        url = await serve_http(ctx, app, ServerConfig(port=0, graceful_shutdown_s=1.0), "warning")
        yield url


async def _until(predicate, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_stream_client_disconnect_aborts(played, pipeline):
    played.mode = "hang"
    pipeline.config = PipelineConfig(request_timeout=60.0)  # only the disconnect can abort
    async with running_server(pipeline) as url, httpx.AsyncClient(base_url=url) as client:
        async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if '"content":"a"' in line:
                    break
            assert pipeline.open_requests == 1
        # leaving the block closes the connection mid-stream
        await played.wait_for(played.aborts, timeout=1.5)
        await _until(lambda: pipeline.open_requests == 0)
        assert played.aborts[0].rid == played.submits[0].rid
        await played.wait_for(played.releases)


async def test_non_stream_client_disconnect_aborts(played, pipeline):
    played.mode = "hang"
    pipeline.config = PipelineConfig(request_timeout=60.0)  # only the disconnect can abort
    async with running_server(pipeline) as url, httpx.AsyncClient(base_url=url) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/completions", json={"model": MODEL, "prompt": "x"}, timeout=0.5)
        await played.wait_for(played.aborts, timeout=1.5)
        await _until(lambda: pipeline.open_requests == 0)
        # the server is fine afterwards
        played.mode = "finish"
        resp = await client.post("/generate", json={"text": "x"})
        assert resp.json()["text"] == "w0 w1 w2 w3 "


async def test_many_concurrent_streams(played, pipeline):
    async with running_server(pipeline) as url, httpx.AsyncClient(base_url=url) as client:
        async def one() -> str:
            resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True})
            return resp.text

        bodies = await asyncio.gather(*(one() for _ in range(16)))
    assert all(b.endswith("data: [DONE]\n\n") and "w3" in b for b in bodies)
    assert pipeline.open_requests == 0


def test_process_serves_and_stops_on_sigterm(nats_server, subject_prefix):
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.gateway", "--port", "0", "--nats-url", nats_server.url,
         "--subject-prefix", subject_prefix, "--api-key", "k1"],
        stderr=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    try:
        url = None
        for line in proc.stderr:
            match = re.search(r"gateway listening on (http://\S+)", line)
            if match:
                url = match.group(1)
                break
        assert url, "gateway never listened"
        auth = {"Authorization": "Bearer k1"}
        models = httpx.get(url + "/v1/models", headers=auth, timeout=5)  # nothing behind it yet
        assert models.status_code == 503 and models.json()["error"]["code"] == "not_ready"
        assert httpx.get(url + "/v1/models", timeout=5).status_code == 401  # auth comes first
        health = httpx.get(url + "/health", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _plain_text(event) -> str | None:
    """The text of a chunk that only carries text (no role, no finish), else None."""
    if not isinstance(event, dict) or not event.get("choices"):
        return None
    choice = event["choices"][0]
    delta = choice.get("delta", {})
    if choice.get("finish_reason") is not None or "role" in delta:
        return None
    return choice.get("text") or delta.get("content") or None


def _payloads(body: str) -> list:
    """The stream's events less what differs between two requests (id, created), each run
    of text-only chunks joined into one (how deltas group into events depends on timing)."""
    out: list = []
    for event in parse_sse(body.encode()):
        if isinstance(event, dict):
            event.pop("id", None)
            event.pop("created", None)
        text = _plain_text(event)
        if text is not None and out and _plain_text(out[-1]) is not None:
            choice = out[-1]["choices"][0]
            if "text" in choice:
                choice["text"] += text
            else:
                choice["delta"]["content"] += text
            continue
        out.append(event)
    return out


@asynccontextmanager
async def watched(pipeline):
    """Every generation the pipeline submits, to read how its deltas went out."""
    gens, submit = [], pipeline.submit

    async def recording(req):
        gens.append(await submit(req))
        return gens[-1]

    pipeline.submit = recording
    try:
        yield gens
    finally:
        pipeline.submit = submit


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {**CHAT, "stream": True}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": True,
                         "stream_options": {"include_usage": True}}),
])
async def test_plain_deltas_go_straight_to_the_connection_with_the_same_bytes(played, pipeline, path, body):
    """Through uvicorn a plain stream's deltas after the first skip the queue (Generation.offer);
    its events are those of the queued path (an in-process ASGI client has no raw connection)."""
    played.words = 12
    async with running_server(pipeline) as url, watched(pipeline) as gens, \
            httpx.AsyncClient(base_url=url) as client:
        direct = (await client.post(path, json=body)).text
    async with watched(pipeline) as queued_gens, httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(pipeline, GatewaySettings(MODEL),
                                                         BusHealth(pipeline.bus, pipeline.subjects))),
            base_url="http://gw") as client:
        queued = (await client.post(path, json=body)).text
    assert _payloads(direct) == _payloads(queued)
    assert "".join(e["choices"][0].get("text") or e["choices"][0].get("delta", {}).get("content") or ""
                   for e in _payloads(direct)[:-1] if isinstance(e, dict) and e["choices"]) \
        == "".join(f"w{i} " for i in range(12))
    assert gens[0].direct_deltas >= 4 and queued_gens[0].direct_deltas == 0
    assert gens[0].output_ids == [100 + i for i in range(12)] and gens[0].emitted_chars == len(
        "".join(f"w{i} " for i in range(12)))


async def test_a_stream_resumed_after_direct_deltas_has_no_gap_or_repeat(played, pipeline):
    """The first worker is lost after 6 words, most of them sent straight to the connection:
    the resume starts from what the client got (output_ids, emitted_chars kept by offer)."""
    played.words, played.lost_workers, played.lost_after = 12, {"w1"}, 6
    async with running_server(pipeline) as url, watched(pipeline) as gens, \
            httpx.AsyncClient(base_url=url) as client:
        body = (await client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True})).text
    text = "".join(e["choices"][0]["text"] for e in _payloads(body) if isinstance(e, dict))
    assert text == "".join(f"w{i} " for i in range(12))
    assert gens[0].direct_deltas >= 2 and gens[0].retries == 1
    assert [s.num_output_tokens for s in played.submits] == [0, 6]
