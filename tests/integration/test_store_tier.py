"""The shared store (L3) through the real stack: a worker with a host tier and
`--kv-store nats` puts every page it computes into a JetStream KV bucket; after its
process is killed and restarted with an empty cache (or after its cache is flushed)
a document comes from the store instead of being recomputed, with the same greedy
output. With the store's own nats-server killed mid-run every request still
completes, as fast as recomputing plus the fetch deadline, and nothing leaks."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.launcher import LocalStack, ephemeral_stack_config
from radixmesh.natsd import NatsServer, free_port

from .conftest import StackBus

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STORE_FLAGS = ["--host-kv-slots", "8192", "--kv-store", "nats"]


def document(topic: str, clauses: int = 90) -> str:
    return " ".join(f"Clause {k} on {topic}: the keeper writes it down before dusk." for k in range(clauses))


async def ask(client, text: str, max_new=8) -> dict:
    """A streamed /generate; its last event (cumulative output, usage, the server's TTFT)."""
    last = None
    async with client.stream("POST", "/generate", json={
            "text": text, "stream": True,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0}}) as reply:
        assert reply.status_code == 200, await reply.aread()
        async for line in reply.aiter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[len("data: "):])
    assert last is not None and "ttft_s" in last["meta_info"], last
    return last


async def worker_stats(stack):
    bus = StackBus(stack)
    (worker,) = (await bus.workers()).workers
    return await bus.sched_stats(worker.worker_id)


async def puts_done(stack, tokens: int, limit=30.0):
    """Every page of ``tokens`` put (uploads run in the background: give them a moment)."""
    deadline = time.monotonic() + limit
    while (await worker_stats(stack)).store_put_tokens < tokens:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)


async def rejoined(stack, limit=180.0):
    """The restarted worker serves (a fresh scheduler session: no steps yet)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            stats = await worker_stats(stack)
            if stats.steps == 0:
                return
        except Exception:  # noqa: BLE001 - the worker is away: keep asking
            pass
        assert time.monotonic() < deadline, "the worker never came back"
        await asyncio.sleep(0.5)


async def tier_tokens(client, tier: str, at_least: int, limit=10.0) -> float:
    """The gateway's cached prompt tokens from ``tier`` (counted as each request closes)."""
    deadline = time.monotonic() + limit
    while True:
        text = (await client.get("/metrics")).text
        got = sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                  if s.name == "radixmesh:cached_tokens_by_tier_total" and s.labels["tier"] == tier)
        if got >= at_least or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.2)


def assert_nothing_held(stats):
    assert stats.running == stats.waiting == stats.protected_slots == 0
    assert stats.free_slots + stats.evictable_slots == 16384


async def test_a_restarted_worker_takes_a_document_from_the_store(tmp_path):
    config = ephemeral_stack_config(tmp_path / "logs", dtype="float32", threads_per_worker=1,
                                    extra={"gpu_worker": STORE_FLAGS})
    text = document("tides") + "\nWhat does clause 7 say?"
    with LocalStack(config, progress=lambda m: None) as stack:
        async with httpx.AsyncClient(base_url=stack.url, timeout=300) as client:
            cold = await ask(client, text)
            prompt = cold["meta_info"]["prompt_tokens"]
            await puts_done(stack, prompt // 16 * 16)
            worker = next(p for p in stack.procs if p.service == "gpu_worker")
            worker.popen.kill()  # the launcher restarts it, empty
            await rejoined(stack)
            warm = await ask(client, text)
            from_store = await tier_tokens(client, "store", warm["meta_info"]["cached_tokens"])
            metrics = (await client.get("/metrics")).text
        stats = await worker_stats(stack)
    assert warm["output_ids"] == cold["output_ids"]
    assert warm["meta_info"]["cached_tokens"] >= 0.9 * prompt
    # NOTE: the restarted worker held nothing: every cached token came from the store
    assert warm["meta_info"]["cached_tokens_details"] == {
        "device": 0, "host": 0, "store": warm["meta_info"]["cached_tokens"]}
    assert cold["meta_info"]["cached_tokens_details"]["store"] == 0
    assert from_store == warm["meta_info"]["cached_tokens"]
    assert stats.store_fetches == {"complete": 1} and stats.store_fetched_tokens >= 0.9 * prompt
    assert warm["meta_info"]["ttft_s"] < 0.5 * cold["meta_info"]["ttft_s"], (warm["meta_info"], cold["meta_info"])
    assert 'outcome="complete"' in metrics
    assert_nothing_held(stats)


async def test_a_store_killed_mid_run_costs_reuse_not_requests(tmp_path):
    """... and a worker (re)started while the store's server is down serves without it
    after its connect deadline (~10 s) instead of hanging, and says so."""
    store = NatsServer(log_file=tmp_path / "store.log", jetstream_dir=tmp_path / "store-js").start()
    metrics_port = free_port()
    config = ephemeral_stack_config(tmp_path / "logs", dtype="float32", threads_per_worker=1,
                                    extra={"gpu_worker": [*STORE_FLAGS, "--kv-store-url", store.url,
                                                          "--metrics-port", str(metrics_port)]})
    texts = [document(t, clauses=45) + "\nSum it up." for t in ("rain", "salt")]  # ~700 tokens each
    worker_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        with LocalStack(config, progress=lambda m: None) as stack:
            async with httpx.AsyncClient(base_url=stack.url, timeout=300) as client:
                assert store_available(await client.get(worker_metrics)) == 1
                cold = [await ask(client, t) for t in texts]
                await puts_done(stack, sum(c["meta_info"]["prompt_tokens"] // 16 * 16 for c in cold))
                assert (await client.post("/flush_cache")).status_code == 200
                fetched = await ask(client, texts[0])  # from the store, which still runs
                assert fetched["meta_info"]["cached_tokens"] >= 0.9 * cold[0]["meta_info"]["prompt_tokens"]
                assert (await client.post("/flush_cache")).status_code == 200
                store.stop()
                started = time.monotonic()
                again = [await ask(client, t) for t in texts]
                elapsed = time.monotonic() - started
                stats = await worker_stats(stack)
                worker = next(p for p in stack.procs if p.service == "gpu_worker")
                worker.popen.kill()  # restarted by the launcher while the store is still down
                down = time.monotonic()
                await rejoined(stack)
                print(f"worker back without its store after {time.monotonic() - down:.1f} s")
                alone = await ask(client, texts[1])
                assert store_available(await client.get(worker_metrics)) == 0
            log = worker.log.read_text()
    finally:
        store.stop()
    assert fetched["output_ids"] == cold[0]["output_ids"]
    assert [a["output_ids"] for a in again] == [c["output_ids"] for c in cold]
    # NOTE: each request waits at most for its fetch deadline (<= 5 s) before recomputing
    cold_s = sum(c["meta_info"]["ttft_s"] for c in cold)
    assert all(a["meta_info"]["ttft_s"] <= c["meta_info"]["ttft_s"] * 2 + 5.5 for a, c in zip(again, cold))
    assert elapsed < 2 * cold_s + 3 * 5.5 + 30
    lost = {k: v for k, v in stats.store_fetches.items() if k not in ("complete", "skipped")}
    assert sum(lost.values()) >= len(texts), stats.store_fetches  # counted by reason
    assert_nothing_held(stats)
    assert alone["output_ids"] == cold[1]["output_ids"]
    assert alone["meta_info"]["cached_tokens_details"]["store"] == 0
    assert f"shared KV store at {store.url} unreachable" in log


def store_available(reply: httpx.Response) -> float:
    (value,) = [s.value for f in text_string_to_metric_families(reply.text) for s in f.samples
                if s.name == "radixmesh:kv_store_available"]
    return value
