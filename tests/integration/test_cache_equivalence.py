"""120 prompts with random branching shared prefixes, sent at once to one worker
whose KV pool cannot hold them all, in small prefill chunks: under every schedule
policy (fcfs with forced retraction), greedy outputs equal a run with the cache off."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from libs.protocol import Bus, Subjects
from libs.protocol.messages import SchedStats, SchedStatsRequest, WorkersReply, WorkersRequest
from radixmesh.launcher import LocalStack, ephemeral_stack_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORDS = ("river mountain teacher garden window silver morning letter village market "
         "engine story winter doctor bridge forest candle ocean station library").split()
SEED = random.randrange(1 << 30)


def branching_prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(6, 14))).capitalize() + "."

    roots = [" ".join(sentence() for _ in range(rng.randrange(2, 5))) for _ in range(6)]
    prompts = []
    for _ in range(n):
        text = rng.choice(roots)
        for _ in range(rng.randrange(0, 3)):
            text += " " + sentence()
        prompts.append(text + " In short,")
    return prompts


async def run(tmp_path, name: str, scheduler_flags: list[str], prompts: list[str]):
    config = ephemeral_stack_config(tmp_path / name, kv_slots=1024, dtype="float32",
                                    extra={"scheduler": ["--chunked-prefill-size", "64",
                                                         *scheduler_flags]})
    stack = LocalStack(config, progress=lambda m: None).start()
    try:
        limits = httpx.Limits(max_connections=len(prompts) + 8)
        async with httpx.AsyncClient(base_url=stack.url, timeout=600, limits=limits) as client:
            replies = await asyncio.gather(*(client.post("/generate", json={
                "text": p, "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
                for p in prompts))
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies][:3]
        outputs = [r.json()["output_ids"] for r in replies]
        bus = await Bus.connect(stack.nats_url, "test")
        try:
            subjects = Subjects(config.subject_prefix)
            (worker,) = (await bus.request(subjects.index_workers(), WorkersRequest(),
                                           WorkersReply)).workers
            stats = await bus.request(subjects.sched_stats(worker.worker_id),
                                      SchedStatsRequest(), SchedStats)
        finally:
            await bus.close()
        return outputs, stats
    finally:
        stack.stop()


async def test_outputs_identical_with_cache_on_and_off(tmp_path):
    prompts = branching_prompts(120, SEED)
    reference, ref_stats = await run(tmp_path, "off", ["--disable-radix-cache"], prompts)
    assert ref_stats.cached_tokens == 0 and ref_stats.requests_finished == 120
    runs = {  # NOTE: every policy once; forced retraction rides the fcfs run (one stack fewer)
        "lpm": ["--schedule-policy", "lpm"],
        "dfs-weight": ["--schedule-policy", "dfs-weight"],
        "fcfs-retract": ["--schedule-policy", "fcfs", "--retract-interval", "4"],
    }
    for name, flags in runs.items():
        outputs, stats = await run(tmp_path, name, flags, prompts)
        mismatched = [i for i, (a, b) in enumerate(zip(outputs, reference)) if a != b]
        assert not mismatched, (name, SEED, mismatched[:5])
        assert stats.cached_tokens > stats.prompt_tokens // 4, (name, stats)
        assert stats.free_slots + stats.evictable_slots == 1024 and stats.protected_slots == 0
        if name == "fcfs-retract":
            assert stats.retractions > 0
