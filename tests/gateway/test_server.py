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
