"""Models, health and the OpenAPI document of the app."""

from __future__ import annotations

import httpx

from libs.protocol.messages import Ping, Pong, WorkerSummary, WorkersReply, WorkersRequest
from services.gateway.app import create_app
from services.gateway.health import BusHealth
from services.gateway.routes import GatewaySettings


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


async def _unhealthy():
    raise AssertionError("not called")


async def test_models_and_openapi(pipeline):
    app = create_app(pipeline, GatewaySettings("my-model", ("default",)), _unhealthy)
    async with _client(app) as client:
        models = (await client.get("/v1/models")).json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == ["my-model"]
        assert models["data"][0]["object"] == "model"
        assert (await client.get("/v1/models/default")).json()["id"] == "default"
        err = (await client.get("/v1/models/other")).json()["error"]
        assert err["code"] == "model_not_found"
        resp = await client.get("/openapi.json")
    doc = resp.json()
    assert doc["openapi"].startswith("3.1")
    assert {"/v1/chat/completions", "/v1/completions", "/generate", "/v1/models", "/health"} <= set(doc["paths"])
    schemas = doc["components"]["schemas"]
    ref = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    chat = schemas[ref.rsplit("/", 1)[1]]
    assert "messages" in chat["properties"] and "model" in chat["required"]
    assert chat["additionalProperties"] is False
    # every reference points at a defined schema
    refs = set()

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                refs.add(node["$ref"].rsplit("/", 1)[1])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    assert refs and refs <= set(schemas)


async def test_health_needs_tokenizer_and_a_worker(pipeline, bus):
    subjects = pipeline.subjects
    app = create_app(pipeline, GatewaySettings("m"), BusHealth(bus, subjects, timeout=0.3))
    workers: list[WorkerSummary] = []

    async with _client(app) as client:
        resp = await client.get("/health")
        assert resp.status_code == 503
        missing = " ".join(resp.json()["missing"])
        assert "tokenizer" in missing and "cache_index" in missing

        async def pong(_: Ping) -> Pong:
            return Pong(service="tokenizer", instance="tok-1", uptime_s=1.0)

        async def list_workers(_: WorkersRequest) -> WorkersReply:
            return WorkersReply(workers=list(workers))

        await bus.subscribe(subjects.ping("tokenizer"), pong, Ping)
        await bus.subscribe(subjects.index_workers(), list_workers, WorkersRequest)
        resp = await client.get("/health")
        assert resp.status_code == 503
        assert resp.json()["missing"] == ["workers: the cache index knows no live worker"]

        workers.append(WorkerSummary(worker_id="w1", scheduler_id="s1", model="m", running=0,
                                     waiting=0, free_slots=10, total_slots=10, inflight=0, age_s=0.1))
        resp = await client.get("/health")
        assert resp.status_code == 200
        assert resp.json() == {"status": "ok", "tokenizer": "tok-1", "workers": 1}
