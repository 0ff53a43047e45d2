"""Tenant isolation through the whole stack: API keys name tenants, and a tenant's
prefix cache is its own (the same prompt from another tenant finds nothing cached)."""

from __future__ import annotations

import httpx
import pytest

from radixmesh.launcher import LocalStack, ephemeral_stack_config
from services.gateway.sse import parse_sse

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
PAGE = 16
DOC = ("The tenant handbook says that every customer has a private cache, a private key and "
       "a private namespace. Nothing one customer sends is ever reused for another. ") * 5
KEYS = {"key-acme": "acme", "key-globex": "globex", "key-acme-2": "acme"}


@pytest.fixture(scope="module")
def tenant_stack(tmp_path_factory):
    logs = tmp_path_factory.mktemp("tenant-stack")
    keys = logs / "keys.json"
    keys.write_text("{" + ", ".join(f'"{k}": "{t}"' for k, t in KEYS.items()) + "}")
    config = ephemeral_stack_config(logs, workers=1,
                                    extra={"gateway": ["--api-keys-file", str(keys)]})
    with LocalStack(config, progress=lambda msg: None) as running:
        yield running


@pytest.fixture(scope="module")
def client(tenant_stack):
    with httpx.Client(base_url=tenant_stack.url, timeout=300) as client:
        yield client


def complete(client: httpx.Client, key: str, prompt: str, **extra) -> dict:
    resp = client.post("/v1/completions", headers={"Authorization": f"Bearer {key}"}, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()


def cached(body: dict) -> int:
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def full_hit(body: dict) -> int:
    """Everything but the last prompt token, in whole pages."""
    return (body["usage"]["prompt_tokens"] - 1) // PAGE * PAGE


def test_same_prompt_two_tenants(client):
    prompt = DOC + "Question: who may reuse my cache?"
    acme = complete(client, "key-acme", prompt)
    globex = complete(client, "key-globex", prompt)
    assert cached(acme) == 0
    assert cached(globex) == 0  # acme's cached prefix is invisible to globex
    again = complete(client, "key-acme", prompt)
    assert cached(again) == full_hit(again) > 0  # the same tenant hits
    other_key = complete(client, "key-acme-2", prompt)
    assert cached(other_key) == full_hit(other_key)  # tenants, not keys, own caches
    assert cached(complete(client, "key-globex", prompt)) == full_hit(globex)


def test_cache_salt_still_splits_inside_a_tenant(client):
    prompt = DOC + "Question: does a salt still matter?"
    first = complete(client, "key-acme", prompt, cache_salt="s1")
    other = complete(client, "key-acme", prompt, cache_salt="s2")
    # a salt chosen to look like another tenant's namespace does not reach it
    spoof = complete(client, "key-globex", prompt, cache_salt="s1")
    assert cached(first) == cached(other) == cached(spoof) == 0
    assert cached(complete(client, "key-acme", prompt, cache_salt="s1")) == full_hit(first)


def stream_usage(client: httpx.Client, key: str, content: str) -> dict:
    resp = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={
        "model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    assert resp.status_code == 200
    events = parse_sse(resp.content)
    assert events[-1] == "[DONE]"
    return events[-2]["usage"]


def test_streaming_chat_is_isolated_too(client):
    content = DOC + "Question: does streaming use the tenant too?"
    stream_usage(client, "key-globex", content)
    first = stream_usage(client, "key-acme", content)
    again = stream_usage(client, "key-acme", content)
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["prompt_tokens_details"]["cached_tokens"] == full_hit({"usage": again}) > 0


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer key-unknown"}],
                         ids=["no-key", "unknown-key"])
def test_request_without_a_valid_key_is_refused(client, headers):
    resp = client.post("/v1/completions", headers=headers,
                       json={"model": MODEL, "prompt": DOC, "max_tokens": 2})
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/health").status_code == 200  # health stays open
