"""Two real workers: a document's questions stick to one worker; when it dies its
unstarted requests move and traffic follows within 3 s; a joining worker gets work."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import pytest

from radixmesh.launcher import BROKER, SERVICES, LocalStack, ephemeral_stack_config

from .cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
DOC = ("Section 4 of the handbook covers travel: book trains two weeks ahead, keep every "
       "receipt, and file expenses within thirty days of returning. ") * 8


async def stream(client: httpx.AsyncClient, prompt: str, max_tokens: int,
                 output: asyncio.Event | None = None) -> dict:
    """Returns {"ok", "started"}: whether it finished and whether output arrived first;
    sets ``output`` at its first text."""
    started = False
    try:
        async with client.stream("POST", "/v1/completions", json={
                "model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "stream": True}) as resp:
            if resp.status_code != 200:
                return {"ok": False, "started": False}
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return {"ok": False, "started": started}
                started = started or bool(event["choices"] and event["choices"][0]["text"])
                if started and output is not None:
                    output.set()
        return {"ok": True, "started": started}
    except httpx.HTTPError:
        return {"ok": False, "started": started}


async def test_affinity_failover_and_join(tmp_path):
    # at most 2 running requests per worker: the rest wait in the queue when it dies
    # NOTE: the killed worker must stay dead here (the index's view of a lost worker is
    # under test), so this stack does not restart workers; tests/launcher tests restarts
    config = ephemeral_stack_config(tmp_path, workers=2, kv_slots=4096, threads_per_worker=1,
                                    extra={"scheduler": ["--max-running-requests", "2"]},
                                    supervise=tuple(s for s in (*SERVICES, BROKER)
                                                    if s != "gpu_worker"))
    stack = LocalStack(config, progress=lambda m: None).start()
    extra = None
    try:
        cluster = Cluster(stack)
        await cluster.wait_for_workers(2)
        async with httpx.AsyncClient(base_url=stack.url, timeout=300) as client:
            for i in range(4):  # the same document, question after question
                r = await client.post("/v1/completions", json={
                    "model": MODEL, "prompt": DOC + f"Question {i}: what about receipts?",
                    "max_tokens": 4, "temperature": 0})
                assert r.status_code == 200, r.text
            counts = await cluster.finished()
            home = max(counts, key=counts.get)
            assert counts[home] == 4, counts

            # queue work on the home worker, then kill it as soon as it streams: the two
            # running requests have output, the four queued behind them none (NOTE: a fixed
            # sleep let a fast worker finish all six before the kill)
            output = asyncio.Event()
            tasks = [asyncio.create_task(stream(client, DOC + f"Q{i}: summarise.", 48, output))
                     for i in range(6)]
            await asyncio.wait_for(output.wait(), 120)
            cluster.stack.kill(cluster.worker_proc(home))
            killed = time.monotonic()
            results = await asyncio.gather(*tasks)
            assert all(r["ok"] or r["started"] for r in results), results
            moved = (tmp_path / "gateway.log").read_text().count("moved from")
            assert moved >= 1  # queued requests were resubmitted to the survivor

            await asyncio.sleep(max(0.0, 3.0 - (time.monotonic() - killed)))
            after = await client.post("/v1/completions", json={
                "model": MODEL, "prompt": DOC + "After the failure?", "max_tokens": 4})
            assert after.status_code == 200, after.text
            assert await cluster.workers() != [] and home not in await cluster.workers()

            # a new worker joins and receives traffic
            survivor = (await cluster.workers())[0]
            extra = subprocess.Popen([
                sys.executable, "-m", "services.gpu_worker", "--nats-url", stack.nats_url,
                "--subject-prefix", config.subject_prefix, "--threads", "1",
                "--kv-slots", "4096", "--worker-id", "joiner"],
                stdout=open(tmp_path / "joiner.log", "wb"), stderr=subprocess.STDOUT)
            await cluster.wait_for_workers(2)
            replies = await asyncio.gather(*(client.post("/v1/completions", json={
                "model": MODEL, "prompt": f"Fresh topic {i}: the moon is", "max_tokens": 8})
                for i in range(6)))
            assert all(r.status_code == 200 for r in replies)
            counts = await cluster.finished()
            assert counts.get("joiner", 0) > 0, (counts, survivor)
    finally:
        if extra is not None:
            extra.terminate()
            extra.wait(timeout=10)
        stack.stop()
