"""The host tier through the real stack: a worker whose device pool holds fewer
documents than are asked in a cycle demotes them to its host pool and loads them
back; greedy outputs equal a stack without the host tier, which recomputes them."""

from __future__ import annotations

import httpx
import pytest

from radixmesh.launcher import LocalStack, ephemeral_stack_config

from .conftest import StackBus

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPICS = ("rivers", "bread", "bees", "bridges", "winter skies", "old maps")


def prompts() -> list[str]:
    docs = [" ".join(f"Note {k} about {t}: it is worth a careful look." for k in range(20))
            for t in TOPICS]  # ~240 tokens each: six of them outgrow 1,024 device slots
    return [f"{docs[i % len(docs)]}\nQuestion {i}: what is it about?" for i in range(12)]


async def serve(tmp_path, name: str, host_slots: int):
    extra = {"gpu_worker": ["--host-kv-slots", str(host_slots)]} if host_slots else {}
    config = ephemeral_stack_config(tmp_path / name, kv_slots=1024, dtype="float32", extra=extra)
    with LocalStack(config, progress=lambda m: None) as stack:
        async with httpx.AsyncClient(base_url=stack.url, timeout=300) as client:
            outputs, from_host = [], 0
            for text in prompts():  # one at a time: the cycle evicts each document in turn
                reply = await client.post("/generate", json={
                    "text": text, "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
                assert reply.status_code == 200, reply.text
                body = reply.json()
                outputs.append(body["output_ids"])
                tiers = body["meta_info"]["cached_tokens_details"]
                assert tiers["device"] + tiers["host"] == body["meta_info"]["cached_tokens"]
                from_host += tiers["host"]
            metrics = (await client.get("/metrics")).text
        stack_bus = StackBus(stack)
        (worker,) = (await stack_bus.workers()).workers
        stats = await stack_bus.sched_stats(worker.worker_id)
    assert from_host == stats.host_loaded_tokens  # every loaded token reported to its request
    return outputs, stats, metrics


async def test_outputs_identical_and_documents_load_back(tmp_path):
    plain, plain_stats, _ = await serve(tmp_path, "plain", 0)
    tiered, stats, metrics = await serve(tmp_path, "tiered", 8192)
    assert tiered == plain
    assert stats.host_slots == 8192 and stats.host_demoted_tokens > 0
    assert stats.host_loaded_tokens >= 6 * 200  # the second round came back
    assert stats.cached_tokens >= plain_stats.cached_tokens + 6 * 200
    assert "radixmesh:host_loaded_tokens{" in metrics
