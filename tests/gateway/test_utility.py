"""SGLang's utility endpoints on the gateway app (a recording backend; the real stack
answers them in tests/integration/test_utility_endpoints.py)."""

from __future__ import annotations

import importlib.metadata

import httpx
import pytest

from libs.protocol import errors, tracing
from services.gateway.app import create_app
from services.gateway.routes import GatewaySettings
from services.gateway.utility import ServerInfo, public_config

from .test_routes import MODEL, RecordingBackend, _error, _healthy


class AbortingBackend(RecordingBackend):
    def __init__(self, open_ids: set[str]) -> None:
        super().__init__()
        self.open_ids, self.aborted, self.rids = open_ids, [], []

    async def submit(self, req):
        self.rids.append(tracing.request_id.get())
        return await super().submit(req)

    def abort(self, rid: str) -> bool:
        self.aborted.append(rid)
        return rid in self.open_ids


@pytest.fixture()
def backend() -> AbortingBackend:
    return AbortingBackend({"abc123"})


def _client(backend, info=None, **settings) -> httpx.AsyncClient:
    app = create_app(backend, GatewaySettings(MODEL, **settings), _healthy, info=info)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


async def test_version_and_model_info(backend):
    info = ServerInfo("/models/smol", {"port": 8000})
    async with _client(backend, info) as client:
        version = (await client.get("/version")).json()
        model = (await client.get("/get_model_info")).json()
    assert version == {"version": importlib.metadata.version("radixmesh")}
    assert model["model_path"] == model["tokenizer_path"] == "/models/smol"
    assert model["is_generation"] is True and model["served_model_name"] == MODEL


async def test_server_info_is_the_configuration_without_secrets(backend):
    async def workers():
        return [{"worker_id": "w0"}]

    settings = GatewaySettings(MODEL, api_key="sekret-key")
    info = ServerInfo("smol", public_config(settings), workers)
    async with _client(backend, info, api_key="sekret-key") as client:
        assert (await client.get("/get_server_info")).status_code == 401
        resp = await client.get("/get_server_info", headers={"Authorization": "Bearer sekret-key"})
    body = resp.json()
    assert "sekret-key" not in resp.text and body["api_key_set"] is True
    assert body["served_model_name"] == MODEL and body["max_body_bytes"] == settings.max_body_bytes
    assert body["workers"] == [{"worker_id": "w0"}] and body["version"]


async def test_server_info_says_when_the_workers_cannot_be_listed(backend):
    async def workers():
        raise errors.unavailable("index down")

    async with _client(backend, ServerInfo("smol", {}, workers)) as client:
        body = (await client.get("/get_server_info")).json()
    assert "workers" not in body and "index down" in body["workers_error"]


async def test_health_generate_is_503_json_when_generation_fails(backend):
    async with _client(backend) as client:
        err = _error(await client.get("/health_generate"), 503, contains="health generation failed")
    assert err["code"] == "unhealthy"
    [req] = backend.requests
    assert (req.max_new_tokens, req.params.temperature, req.add_generation_prompt) == (1, 0.0, False)


async def test_abort_request_by_id(backend):
    async with _client(backend) as client:
        assert (await client.post("/abort_request", json={"rid": "abc123"})).json() == {"aborted": "abc123"}
        assert (await client.post("/abort_request", json={"rid": "chatcmpl-abc123"})).status_code == 200
        err = _error(await client.post("/abort_request", json={"rid": "nope"}), 404, "rid")
        assert err["code"] == "request_not_found"
        _error(await client.post("/abort_request", json={}), 400, "rid")
        _error(await client.post("/abort_request", json={"rid": "a b"}), 400, "rid")
    assert backend.aborted == ["abc123", "abc123", "nope"]


async def test_generate_takes_the_clients_rid(backend):
    async with _client(backend) as client:
        await client.post("/generate", json={"text": "a", "rid": "mine-1"})
        _error(await client.post("/generate", json={"text": "a", "rid": ""}), 400, "rid")
    assert len(backend.requests) == 1 and backend.rids == ["mine-1"]
