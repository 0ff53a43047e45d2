"""TTFT of documents computed cold vs the same documents after their worker was killed
and restarted with an empty cache: with `--kv-store nats` their pages come back from the
shared store (L3) instead of being recomputed. One worker, its own stack, one run.

    python -m radixmesh.benchmarks.store_restart [--dtype float32] [--docs 3] [--doc-clauses 180]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from libs.protocol import Bus, Subjects
from libs.protocol.messages import SchedStats, SchedStatsRequest, WorkersReply, WorkersRequest
from radixmesh.launcher import LocalStack, ephemeral_stack_config

TOPICS = ("tides", "wind", "fog", "salt", "kelp", "rain")


def document(topic: str, clauses: int) -> str:
    return " ".join(f"Clause {k} on {topic}: the keeper writes it down before dusk." for k in range(clauses))


async def ask(client: httpx.AsyncClient, text: str) -> dict:
    """A streamed /generate: its last event (output, usage, the server's TTFT)."""
    last = None
    body = {"text": text, "stream": True, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    async with client.stream("POST", "/generate", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[6:])
    return last


async def stats(stack: LocalStack) -> SchedStats | None:
    bus = await Bus.connect(stack.nats_url, "bench")
    try:
        subjects = Subjects(stack.config.subject_prefix)
        workers = (await bus.request(subjects.index_workers(), WorkersRequest(), WorkersReply)).workers
        if not workers:
            return None
        return await bus.request(subjects.sched_stats(workers[0].worker_id), SchedStatsRequest(), SchedStats)
    except Exception:  # noqa: BLE001 - the worker is restarting
        return None
    finally:
        await bus.close()


async def until(check, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit("the stack did not get there in time")
        await asyncio.sleep(0.5)


async def measure(stack: LocalStack, texts: list[str]) -> list[tuple[dict, dict]]:
    async with httpx.AsyncClient(base_url=stack.url, timeout=600) as client:
        cold = [await ask(client, t) for t in texts]
        pages = sum(c["meta_info"]["prompt_tokens"] // 16 * 16 for c in cold)

        async def put() -> bool:
            s = await stats(stack)
            return s is not None and s.store_put_tokens >= pages

        await until(put, 60)
        await asyncio.sleep(1.0)  # the last uploads
        next(p for p in stack.procs if p.service == "gpu_worker").popen.kill()

        async def fresh() -> bool:
            s = await stats(stack)
            return s is not None and s.steps == 0

        await until(fresh, 300)
        warm = [await ask(client, t) for t in texts]
    return list(zip(cold, warm))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m radixmesh.benchmarks.store_restart", description=__doc__)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--docs", type=int, default=3)
    p.add_argument("--doc-clauses", type=int, default=180, help="~15 tokens each")
    args = p.parse_args(argv)
    texts = [document(t, args.doc_clauses) + "\nWhat is the rule?" for t in TOPICS[: args.docs]]
    config = ephemeral_stack_config(Path(tempfile.mkdtemp(prefix="rm-store-bench-")), dtype=args.dtype,
                                    threads_per_worker=1,
                                    extra={"gpu_worker": ["--host-kv-slots", "16384", "--kv-store", "nats"]})
    with LocalStack(config, progress=lambda m: None) as stack:
        rows = asyncio.run(measure(stack, texts))
    print(f"| doc | prompt tokens | cold TTFT (s) | after restart, from the store (s) | ratio | cached | same output |")
    print("|---|---|---|---|---|---|---|")
    for i, (c, w) in enumerate(rows):
        cm, wm = c["meta_info"], w["meta_info"]
        print(f"| {i} | {cm['prompt_tokens']:,} | {cm['ttft_s']:.2f} | {wm['ttft_s']:.2f} | "
              f"{wm['ttft_s'] / cm['ttft_s']:.0%} | {wm['cached_tokens']:,} | {c['output_ids'] == w['output_ids']} |")


if __name__ == "__main__":
    main()
