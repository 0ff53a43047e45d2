"""Models, health and the OpenAPI document of the app."""

from __future__ import annotations

import asyncio

import httpx

from libs.protocol.messages import LoadReport, Ping, Pong, WorkerInfo, WorkerSummary, WorkersReply, WorkersRequest
from services.gateway.app import create_app
from services.gateway.fallback import LoadView
from services.gateway.health import BusHealth, HealthReport
from services.gateway.routes import GatewaySettings


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


async def _healthy() -> HealthReport:
    return HealthReport(True, {"status": "ok"})


async def test_models_and_openapi(pipeline):
    app = create_app(pipeline, GatewaySettings("my-model", ("default",)), _healthy)
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

        await _answer_health(bus, subjects, workers)
        resp = await client.get("/health")
        assert resp.status_code == 503
        assert resp.json()["missing"] == ["workers: the cache index knows no live worker"]

        workers.append(WorkerSummary(worker_id="w1", scheduler_id="s1", model="m", running=0,
                                     waiting=0, free_slots=10, total_slots=10, inflight=0, age_s=0.1))
        resp = await client.get("/health")
        assert resp.status_code == 200
        body = resp.json()
        assert body.pop("nats") == {"server": bus.broker()["nats_server"], "url": bus.broker()["nats_url"],
                                    "nodes": 1}  # the node it is on, of a cluster of one
        assert body == {"status": "ok", "tokenizer": "tok-1", "workers": 1}


async def test_models_answer_503_until_a_generation_can_be_served(pipeline):
    ready = False

    async def health() -> HealthReport:
        if ready:
            return HealthReport(True, {"status": "degraded", "detail": "worker w2: gone"})
        return HealthReport(False, {"status": "unavailable", "detail": "tokenizer: no service"})

    app = create_app(pipeline, GatewaySettings("my-model"), health)
    async with _client(app) as client:
        for path in ("/v1/models", "/v1/models/my-model"):
            resp = await client.get(path)
            assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
            err = resp.json()["error"]
            assert err["code"] == "not_ready" and "tokenizer: no service" in err["message"]
        ready = True  # degraded still serves
        assert (await client.get("/v1/models")).json()["data"][0]["id"] == "my-model"
        assert (await client.get("/v1/models/my-model")).status_code == 200


def _no_nats(body: dict) -> dict:
    body.pop("nats")
    return body


def _summary(worker_id: str) -> WorkerSummary:
    return WorkerSummary(worker_id=worker_id, scheduler_id="s1", model="m", running=0, waiting=0,
                         free_slots=10, total_slots=10, inflight=0, age_s=0.1)


async def test_health_is_degraded_while_a_worker_is_gone_and_ok_once_it_is_back(pipeline, bus):
    subjects = pipeline.subjects
    now = [100.0]
    health = BusHealth(bus, subjects, timeout=0.3, forget_s=60, clock=lambda: now[0])
    app = create_app(pipeline, GatewaySettings("m"), health)
    workers = [_summary("w1"), _summary("w2")]

    await _answer_health(bus, subjects, workers)
    async with _client(app) as client:
        assert _no_nats((await client.get("/health")).json()) == {"status": "ok", "tokenizer": "tok-1", "workers": 2}
        workers.pop()  # w2 died
        now[0] += 2
        resp = await client.get("/health")
        assert resp.status_code == 200
        body = resp.json()
        assert body["status"] == "degraded" and body["workers"] == 1
        assert body["degraded"] == ["worker w2: gone since a check 2s ago (restarting or removed)"]
        workers.append(_summary("w2"))  # restarted, rejoined
        assert (await client.get("/health")).json()["status"] == "ok"
        workers.pop()
        now[0] += 30
        assert (await client.get("/health")).json()["status"] == "degraded"
        now[0] += 31  # removed for good: forgotten after forget_s
        assert (await client.get("/health")).json()["status"] == "ok"
        workers.clear()  # no worker at all: down
        assert (await client.get("/health")).status_code == 503


async def test_a_worker_that_said_it_stops_is_not_reported_lost(pipeline, bus):
    subjects = pipeline.subjects
    health = BusHealth(bus, subjects, timeout=0.3, forget_s=60)
    await health.watch()
    app = create_app(pipeline, GatewaySettings("m"), health)
    workers = [_summary("w1"), _summary("w2")]
    await _answer_health(bus, subjects, workers)
    async with _client(app) as client:
        assert (await client.get("/health")).json()["status"] == "ok"
        leaving = WorkerInfo(worker_id="w2", model="m", kv_slots=1, max_requests=1, max_model_len=1,
                             vocab_size=1, eos_token_ids=[], dtype="float32", leaving=True)
        await bus.publish(subjects.worker_announce(), leaving)
        await bus.nc.flush()
        await asyncio.sleep(0.1)
        assert (await client.get("/health")).json()["status"] == "ok"  # still listed: fine
        workers.pop()  # the index dropped it
        assert _no_nats((await client.get("/health")).json()) == {"status": "ok", "tokenizer": "tok-1", "workers": 1}


async def test_health_is_degraded_when_only_the_gateways_own_load_view_has_workers(pipeline, bus):
    subjects = pipeline.subjects
    loads = LoadView()
    app = create_app(pipeline, GatewaySettings("m"), BusHealth(bus, subjects, timeout=0.3, loads=loads))

    async def pong(_: Ping) -> Pong:
        return Pong(service="tokenizer", instance="tok-1", uptime_s=1.0)

    await bus.subscribe(subjects.ping("tokenizer"), pong, Ping)
    async with _client(app) as client:
        assert (await client.get("/health")).status_code == 503  # no index, no view
        await loads._on_load(LoadReport(worker_id="w1", scheduler_id="s1", model="m", running=0,
                                        waiting=0, free_slots=1, total_slots=1, max_model_len=64, ts=0.0))
        resp = await client.get("/health")
        assert resp.status_code == 200
        body = resp.json()
        assert body["status"] == "degraded" and body["workers"] == 1
        assert "cache_index" in body["detail"] and "own load view" in body["detail"]


async def _answer_health(bus, subjects, workers: list) -> None:
    """A tokenizer that answers pings and a cache index that lists ``workers`` (live list)."""

    async def pong(_: Ping) -> Pong:
        return Pong(service="tokenizer", instance="tok-1", uptime_s=1.0)

    async def list_workers(_: WorkersRequest) -> WorkersReply:
        return WorkersReply(workers=list(workers))

    await bus.subscribe(subjects.ping("tokenizer"), pong, Ping)
    await bus.subscribe(subjects.index_workers(), list_workers, WorkersRequest)
