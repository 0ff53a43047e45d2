"""A request served by a prefill worker and a decode worker is still one trace: the
prefill (on the prefill worker), the KV transfer (bytes, tokens, path, seconds) and the
decode, under the one HTTP request."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest

from radixmesh.launcher import LocalStack, ephemeral_stack_config

from .test_stack_observability import MODEL, chat, named, trace_spans

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_prefill_transfer_and_decode_are_one_trace(tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    config = ephemeral_stack_config(tmp_path / "logs", traces=True, workers=0, prefill_workers=1,
                                    decode_workers=1, threads_per_worker=1,
                                    extra={"scheduler": ["--remote-prefill-min-tokens", "0"],
                                           "cache_index": ["--local-prefill-factor", "0"]})
    with LocalStack(config, progress=lambda m: None) as stack:
        async with httpx.AsyncClient(base_url=stack.url, timeout=120) as client:
            for _ in range(240):  # both workers routable: the pair forms
                health = (await client.get("/health")).json()
                if health.get("workers") == 2:
                    break
                await asyncio.sleep(0.25)
            text = "Describe a lighthouse at night in one sentence. " * 8
            resp = await client.post("/v1/chat/completions", json=chat(text))
            assert resp.status_code == 200, resp.text
            trace_id = resp.headers["x-trace-id"]
            spans = await trace_spans(stack, trace_id, lambda s: named(s, "scheduler.kv_transfer")
                                      and named(s, "scheduler.prefill") and named(s, "scheduler.decode")
                                      and named(s, "gpu_worker.forward"))
    (transfer,) = named(spans, "scheduler.kv_transfer")
    attrs = transfer["attributes"]
    prompt = resp.json()["usage"]["prompt_tokens"]
    assert attrs["radixmesh.kv_tokens"] == prompt  # the decode worker had nothing cached
    assert attrs["radixmesh.kv_bytes"] > prompt * 1000 and attrs["radixmesh.kv_path"] in ("shm", "nats")
    assert "radixmesh.kv_failure" not in attrs
    ids = {s["span_id"] for s in spans}
    roots = [s for s in spans if not s["parent_id"]]
    assert [r["name"] for r in roots] == ["POST /v1/chat/completions"]
    orphans = [(s["service"], s["name"]) for s in spans if s not in roots and s["parent_id"] not in ids]
    assert not orphans, (orphans, sorted((s["service"], s["name"]) for s in spans))
    workers = {s["attributes"].get("radixmesh.prefill_worker") for s in named(spans, "scheduler.kv_transfer")}
    assert workers and all(w and w.startswith("p") for w in workers)
    assert resp.headers["x-radixmesh-worker"].startswith("d")
    assert resp.json()["model"] == MODEL
