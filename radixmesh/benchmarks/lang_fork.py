"""The handbook program with fork vs as independent requests, on a stack it starts.

    python -m radixmesh.benchmarks.lang_fork [--inputs 16] [--doc-words 300] [--max-tokens 24]
                                             [--workers 1] [--concurrency 4]

Each input is a fresh document; three analyses of it run in parallel, then one
call combines them. ``fork``: a radixmesh.lang program (the document is held
with a max_tokens 0 request, then the branches run). ``independent``: the same
prompts sent as full requests (the three analyses concurrently, then the
combining one). ``no sharing``: those requests each in a cache namespace of its
own (cache_salt): what a server without prefix reuse computes. The cache is
flushed before fork and independent. Printed: requests, prompt tokens, how
many of them the server computed (prompt - cached), wall time.

NOTE: radixmesh's scheduler already makes concurrent requests that share a
prefix wait for the one computing it, and the cache index routes them together
(bookings), so "independent" reuses the document too; fork guarantees it.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import numpy as np

from radixmesh import lang as rl
from radixmesh.bench.text import TextGen
from radixmesh.launcher import LocalStack, ephemeral_stack_config
from radixmesh.lang.client import Usage

TOPICS = ("leave and holidays", "expenses", "security")


def question(topic: str) -> str:
    return f"Question: What does the handbook say about {topic}?\nAnswer:"


def combine(notes: list[str]) -> str:
    return "Notes:\n" + "".join(f"- {n.strip()}\n" for n in notes) + "Advice for a new employee:"


@rl.function
def handbook(s, document: str, max_tokens: int):
    s += document
    branches = s.fork(len(TOPICS))
    for b, topic in zip(branches, TOPICS):
        b += question(topic) + rl.gen("note", max_tokens=max_tokens, stop="\n")
    s.join(branches)
    s += combine(s["note"]) + rl.gen("advice", max_tokens=max_tokens)


async def independent(client: rl.Client, document: str, max_tokens: int,
                      share: bool = True) -> list[Usage]:
    """The same program as full requests: no hold, every prompt sent whole
    (``share`` False: each in a cache namespace of its own, so nothing is reused)."""
    def params() -> dict:
        salt = None if share else uuid.uuid4().hex
        return dict(max_tokens=max_tokens, temperature=0.0, cache_salt=salt)

    done = await asyncio.gather(*(client.complete(document + question(t), stop="\n", **params())
                                  for t in TOPICS))
    _, usage = await client.complete(document + combine([text for text, _ in done]), **params())
    return [u for _, u in done] + [usage]


def documents(n: int, words: int) -> list[str]:
    gen = TextGen(np.random.default_rng(7))
    paragraphs = max(1, words // 75)
    return ["Employee handbook, edition %d.\n\n" % i
            + "\n\n".join(gen.paragraph(6) for _ in range(paragraphs)) + "\n\n" for i in range(n)]


def run_fork(url: str, docs: list[str], max_tokens: int, concurrency: int) -> tuple[list[Usage], float]:
    with rl.Runtime(url) as rt:
        start = time.perf_counter()
        states = handbook.run_batch([{"document": d, "max_tokens": max_tokens} for d in docs],
                                    runtime=rt, concurrency=concurrency, progress=True)
        wall = time.perf_counter() - start
    return [c.usage for s in states for c in s.all_calls()], wall


async def _run_independent(url: str, docs: list[str], max_tokens: int,
                           concurrency: int, share: bool) -> list[Usage]:
    client = rl.Client(url)
    gate = asyncio.Semaphore(concurrency)

    async def one(doc: str) -> list[Usage]:
        async with gate:
            return await independent(client, doc, max_tokens, share)

    try:
        return [u for us in await asyncio.gather(*(one(d) for d in docs)) for u in us]
    finally:
        await client.close()


def run_independent(url: str, docs: list[str], max_tokens: int, concurrency: int,
                    share: bool = True) -> tuple[list[Usage], float]:
    start = time.perf_counter()
    usages = asyncio.run(_run_independent(url, docs, max_tokens, concurrency, share))
    return usages, time.perf_counter() - start


def flush(url: str) -> None:
    httpx.post(url + "/flush_cache", timeout=60).raise_for_status()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--inputs", type=int, default=16)
    p.add_argument("--doc-words", type=int, default=300, help="~75 words a paragraph")
    p.add_argument("--max-tokens", type=int, default=24, help="per analysis and for the advice")
    p.add_argument("--concurrency", type=int, default=4, help="programs in flight")
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args(argv)
    docs = documents(args.inputs, args.doc_words)
    with tempfile.TemporaryDirectory() as logs:
        config = ephemeral_stack_config(Path(logs), workers=args.workers)
        with LocalStack(config, progress=lambda m: None) as stack:
            run_independent(stack.url, documents(1, 75), 2, 1)  # warm-up
            flush(stack.url)
            fork = run_fork(stack.url, docs, args.max_tokens, args.concurrency)
            flush(stack.url)
            indep = run_independent(stack.url, docs, args.max_tokens, args.concurrency)
            alone = run_independent(stack.url, docs, args.max_tokens, args.concurrency, share=False)
    print(f"\nhandbook program: {args.inputs} inputs, {len(TOPICS)} analyses each, "
          f"~{args.doc_words} words a document, max_tokens {args.max_tokens}, "
          f"concurrency {args.concurrency}, {args.workers} worker(s)")
    print(f"{'mode':<12} {'requests':>8} {'prompt tok':>10} {'cached':>8} {'computed':>9} {'wall s':>7}")
    for name, (usages, wall) in (("fork", fork), ("independent", indep), ("no sharing", alone)):
        prompt = sum(u.prompt_tokens for u in usages)
        cached = sum(u.cached_tokens for u in usages)
        print(f"{name:<12} {len(usages):>8} {prompt:>10} {cached:>8} {prompt - cached:>9} {wall:>7.1f}")


if __name__ == "__main__":
    main()
