"""TTFT of a request whose document is cached vs the same request cold, in one run.

    python -m radixmesh.benchmarks.prefix_ttft [--doc-tokens 1500] [--repeats 3]

Each round flushes the cache, sends a question about a fresh ~1,500-token document
(cold), then another question about the same document (warm), one at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from radixmesh.bench.text import TextGen
from radixmesh.launcher import LocalStack, ephemeral_stack_config


async def ttft(client: httpx.AsyncClient, text: str) -> tuple[float, int]:
    start = time.perf_counter()
    body = {"text": text, "stream": True, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    first, cached = 0.0, 0
    async with client.stream("POST", "/generate", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                first = first or time.perf_counter() - start
                cached = json.loads(line[6:])["meta_info"].get("cached_tokens", 0)
    return first, cached


async def measure(url: str, doc_words: int, repeats: int) -> list[tuple[float, float, int]]:
    rows = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for r in range(repeats):
            gen = TextGen(np.random.default_rng(r))
            doc = "\n\n".join(gen.paragraph(6) for _ in range(max(1, doc_words // 75)))
            (await client.post("/flush_cache")).raise_for_status()
            cold, _ = await ttft(client, doc + "\nQuestion: what is the first topic?")
            warm, cached = await ttft(client, doc + "\nQuestion: who is mentioned last?")
            rows.append((cold, warm, cached))
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--doc-words", type=int, default=1100, help="~1,100 words: ~1,500 tokens")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as logs:
        with LocalStack(ephemeral_stack_config(Path(logs)), progress=lambda m: None) as stack:
            asyncio.run(measure(stack.url, 75, 1))  # warm-up
            rows = asyncio.run(measure(stack.url, args.doc_words, args.repeats))
    print("| round | cold TTFT (ms) | cached TTFT (ms) | cached tokens | cached / cold |")
    print("|---|---|---|---|---|")
    for i, (cold, warm, cached) in enumerate(rows):
        print(f"| {i} | {cold * 1e3:.0f} | {warm * 1e3:.0f} | {cached} | {warm / cold:.3f} |")
    ratio = statistics.median(w / c for c, w, _ in rows)
    print(f"\nmedian cached/cold TTFT: {ratio:.3f}")


if __name__ == "__main__":
    main()
