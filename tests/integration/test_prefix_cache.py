"""Prefix reuse through the whole stack: cached_tokens, salts, flush."""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
DOC = ("The handbook says that every new employee receives a laptop, a badge and a desk. "
       "Security training happens in the first week, and the cafeteria opens at eight. ") * 6


def complete(client: httpx.Client, prompt: str, **extra) -> dict:
    resp = client.post("/v1/completions", json={
        "model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()


def cached(body: dict) -> int:
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_repeated_prefix_is_reported_cached(stack):
    with httpx.Client(base_url=stack.url, timeout=300) as client:
        cold = complete(client, DOC + "Question: when does the cafeteria open?")
        warm = complete(client, DOC + "Question: what does a new employee receive?")
        native = client.post("/generate", json={
            "text": DOC + "Question: when is security training?",
            "sampling_params": {"max_new_tokens": 2, "temperature": 0}}).json()
    assert cached(cold) == 0 or cached(cold) < cached(warm)
    assert cached(warm) >= cold["usage"]["prompt_tokens"] - 16
    assert native["meta_info"]["cached_tokens"] >= cached(warm) - 16


def test_cache_salt_isolates_namespaces(stack):
    prompt = DOC + "Salted question: who gets a badge?"
    with httpx.Client(base_url=stack.url, timeout=300) as client:
        first = complete(client, prompt, cache_salt="tenant-a")
        other = complete(client, prompt, cache_salt="tenant-b")
        again = complete(client, prompt, cache_salt="tenant-a")
    assert cached(first) == 0 and cached(other) == 0
    # everything but the last token can hit, in whole 16-token pages
    assert cached(again) == (again["usage"]["prompt_tokens"] - 1) // 16 * 16


async def test_flush_cache_refused_while_running_then_empties(stack):
    prompt = DOC + "Flush question: what opens at eight?"
    async with httpx.AsyncClient(base_url=stack.url, timeout=300) as client:
        await client.post("/v1/completions", json={"model": MODEL, "prompt": prompt,
                                                    "max_tokens": 2, "temperature": 0})
        long = asyncio.create_task(client.post("/v1/completions", json={
            "model": MODEL, "prompt": "Count slowly:", "max_tokens": 200, "ignore_eos": True}))
        await asyncio.sleep(1.0)
        refused = await client.post("/flush_cache")
        assert refused.status_code == 400 and refused.json()["error"]["message"]
        assert (await long).status_code == 200
        flushed = await client.post("/flush_cache")
        assert flushed.status_code == 200, flushed.text
        assert sum(flushed.json()["flushed"].values()) > 0
        after = (await client.post("/v1/completions", json={
            "model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0})).json()
    assert cached(after) == 0
