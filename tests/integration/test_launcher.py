"""`radixmesh up` with two workers: every service answers a ping, both workers get
traffic, and SIGTERM stops every process cleanly."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from libs.protocol import Bus, Subjects
from libs.protocol.messages import (
    Ping, Pong, SchedStats, SchedStatsRequest, WorkersReply, WorkersRequest,
)
from radixmesh.launcher import LocalStack, ephemeral_stack_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICES = ["gateway", "tokenizer", "cache_index", "scheduler", "gpu_worker"]


async def test_two_workers_share_the_load_and_stop_cleanly(tmp_path):
    config = ephemeral_stack_config(tmp_path, workers=2, kv_slots=4096)
    stack = LocalStack(config, progress=lambda m: None).start()
    try:
        subjects = Subjects(config.subject_prefix)
        bus = await Bus.connect(stack.nats_url, "test")
        try:
            for service in SERVICES:
                pong = await bus.request(subjects.ping(service), Ping(), Pong)
                assert pong.service == service and pong.uptime_s > 0
            workers = []
            for _ in range(40):  # both workers adopted and reporting
                workers = (await bus.request(subjects.index_workers(), WorkersRequest(),
                                             WorkersReply)).workers
                if len(workers) == 2:
                    break
                await asyncio.sleep(0.25)
            assert len(workers) == 2
            async with httpx.AsyncClient(base_url=stack.url, timeout=300) as client:
                replies = await asyncio.gather(*(client.post("/v1/completions", json={
                    "model": "SmolLM2-135M-Instruct", "prompt": f"Count to {i}:",
                    "max_tokens": 8, "temperature": 0}) for i in range(8)))
            assert all(r.status_code == 200 for r in replies)
            finished = []
            for w in workers:
                stats = await bus.request(subjects.sched_stats(w.worker_id), SchedStatsRequest(),
                                          SchedStats)
                finished.append(stats.requests_finished)
            assert sum(finished) == 8 and min(finished) >= 2, finished
        finally:
            await bus.close()
        procs = list(stack.procs)
    finally:
        stack.stop()
    assert {p.name: p.popen.returncode for p in procs} == {p.name: 0 for p in procs}
