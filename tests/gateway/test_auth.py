"""API keys -> tenants: loading, constant-time lookup, 401s, the tenant's cache namespace."""

from __future__ import annotations

import httpx
import pytest

from services.gateway.app import create_app
from services.gateway.auth import (
    DEFAULT_TENANT,
    KeyFileError,
    Keyring,
    load_keyring,
    parse_key_env,
    parse_key_file,
    tenant_digest,
    tenant_salt,
)
from services.gateway.health import HealthReport
from services.gateway.routes import GatewaySettings

MODEL = "m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def test_key_file_formats(tmp_path):
    lines = "# comment\n\nk1 acme   # trailing\nk2 globex\n"
    assert parse_key_file(lines) == [("k1", "acme"), ("k2", "globex")]
    assert parse_key_file('{"k1": "acme", "k2": "globex"}') == [("k1", "acme"), ("k2", "globex")]
    with pytest.raises(KeyFileError, match=":2: expected"):
        parse_key_file("k1 acme\nonly-a-key\n", "keys")
    with pytest.raises(KeyFileError, match="invalid JSON"):
        parse_key_file("{not json")
    with pytest.raises(KeyFileError, match="string"):
        parse_key_file('{"k": 3}')
    assert parse_key_env("a:t1, b:t2,c") == [("a", "t1"), ("b", "t2"), ("c", DEFAULT_TENANT)]


def test_load_keyring_merges_sources(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text('{"file-key": "acme"}')
    ring = load_keyring(path, "env-key:globex", "single")
    assert ring.tenant_of("file-key") == "acme"
    assert ring.tenant_of("env-key") == "globex"
    assert ring.tenant_of("single") == DEFAULT_TENANT
    assert ring.tenant_of("nope") is None and ring.tenant_of("") is None
    assert ring.tenants == {"acme", "globex", DEFAULT_TENANT}
    assert not load_keyring() and not load_keyring(None, "", None)
    with pytest.raises(KeyFileError, match="cannot read"):
        load_keyring(tmp_path / "missing")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(KeyFileError, match="no keys"):
        load_keyring(tmp_path / "empty")
    with pytest.raises(KeyFileError, match="two tenants"):
        load_keyring(None, "k:a,k:b")
    with pytest.raises(KeyFileError, match="bad tenant"):
        load_keyring(None, "k:has space")


def test_keys_are_stored_as_digests():
    ring = Keyring.build([("sekret-key", "acme")])
    assert all(b"sekret" not in digest for digest, _ in ring.entries)
    assert "sekret" not in repr(ring)


def test_tenant_salt_is_injective():
    assert tenant_salt(None, "s") == "s"  # auth off: unchanged
    pairs = [("a", ""), ("a", "b"), ("a:b", ""), ("a", ":b"), ("1:a", ""), ("", "a")]
    salts = {tenant_salt(t, s) for t, s in pairs}
    assert len(salts) == len(pairs)
    assert tenant_salt("a", "") != tenant_salt(None, "")
    assert len(tenant_digest("acme")) == 12 and "acme" not in tenant_digest("acme")


class Recorder:
    def __init__(self) -> None:
        self.salts: list[str] = []

    async def submit(self, req):
        from libs.protocol import errors

        self.salts.append(req.cache_salt)
        raise errors.overloaded("recorded")


async def _healthy() -> HealthReport:
    return HealthReport(True, {"status": "ok"})


def _client(backend, **settings) -> httpx.AsyncClient:
    app = create_app(backend, GatewaySettings(MODEL, **settings), _healthy)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


async def test_tenants_namespace_the_cache_salt():
    backend = Recorder()
    ring = load_keyring(None, "ka:acme,kb:globex")
    async with _client(backend, keyring=ring) as client:
        for key, salt in (("ka", None), ("kb", None), ("ka", "x"), ("kb", "x")):
            body = {**CHAT, "cache_salt": salt} if salt else CHAT
            resp = await client.post("/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {key}"})
            assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
        resp = await client.post("/generate", json={"text": "a", "cache_salt": "x"},
                                 headers={"Authorization": "Bearer ka"})
        assert resp.status_code == 503
    assert backend.salts == [tenant_salt("acme", ""), tenant_salt("globex", ""),
                             tenant_salt("acme", "x"), tenant_salt("globex", "x"),
                             tenant_salt("acme", "x")]
    assert len(set(backend.salts)) == 4


@pytest.mark.parametrize("headers,message", [
    ({}, "Missing API key"),
    ({"Authorization": "Bearer wrong"}, "Incorrect API key provided"),
    ({"Authorization": "Bearer "}, "Incorrect API key provided"),
    ({"Authorization": "Basic a2E6"}, "Incorrect API key provided"),
    ({"Authorization": "ka"}, "Incorrect API key provided"),
])
async def test_unauthorized_requests_get_401(headers, message):
    backend = Recorder()
    async with _client(backend, keyring=load_keyring(None, "ka:acme")) as client:
        resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": "a"},
                                 headers=headers)
        assert resp.status_code == 401, resp.text
        assert resp.headers["www-authenticate"] == "Bearer"
        assert resp.json()["error"] == {"message": message, "type": "invalid_request_error",
                                        "param": None, "code": "invalid_api_key"}
        assert (await client.get("/v1/models", headers=headers)).status_code == 401
        assert (await client.get("/health")).status_code == 200
        ok = await client.get("/v1/models", headers={"Authorization": "bearer ka"})
        assert ok.status_code == 200
    assert backend.salts == []


async def test_single_api_key_joins_the_keyring():
    backend = Recorder()
    async with _client(backend, api_key="solo", keyring=load_keyring(None, "ka:acme")) as client:
        for key in ("solo", "ka"):
            resp = await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert resp.status_code == 200
        await client.post("/generate", json={"text": "a"}, headers={"Authorization": "Bearer solo"})
    assert backend.salts == [tenant_salt(DEFAULT_TENANT, "")]


async def test_without_keys_auth_is_off_and_salt_unchanged():
    backend = Recorder()
    async with _client(backend) as client:
        await client.post("/generate", json={"text": "a", "cache_salt": "mine"})
    assert backend.salts == ["mine"]
