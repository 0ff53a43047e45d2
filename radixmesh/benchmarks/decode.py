"""Decode throughput, side by side in one run.

(a) the worker's ModelRunner driven in-process by the scheduler's SchedulerCore,
(b) the same requests through the full stack over NATS (HTTP streaming),
(b0) the same stack with ``--disable-overlap-schedule`` (each step planned after
     the previous one's result),
(c) HF transformers batched ``generate`` on the same prompts.

    python -m radixmesh.benchmarks.decode [--batches 1 8 32] [--context 256] [--steps 128]

Decode tokens/s excludes prefill: (a) times decode steps only; (b) counts tokens
after the last request's first token; (c) subtracts a prefill-only generate. (a) and
both stacks prefill a batch's prompts in one step (the stacks' scheduler gets a chunk
size that holds the largest batch's), so every request's first token comes from the
same step and (b)'s window holds decode steps only, at batch 64 as at batch 1; the KV
pools are sized for the largest batch.

For (b) the table also gives the worker's idle share over the run (the scheduler's
books: wall time with steps queued or running, less the worker's forward time), the
cores the rest of the machine used meanwhile (the stack's gateway, tokenizer, scheduler,
cache index and broker, the idle (b0) stack, the client: this process, its share given
apart), and the bound those cores leave: a worker of T threads on C cores keeps at most
(C - x) / T of its in-process speed while the others take x cores (1.0 where free cores
absorb them). On 2 cores the gap from (a) to (b) is mostly that bound, not waiting.
The client reads the streams with the lean one of ``sse_client.py`` on uvloop, so that
it takes as little as it can of the cores it shares with the stack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from libs.models import resolve_model
from libs.protocol import event_loop
from libs.protocol.messages import ForwardResult, SamplingParams, WorkerInfo
from radixmesh.bench import worker_time
from radixmesh.launcher import LocalStack, ephemeral_stack_config
from services.gpu_worker.model_runner import ModelRunner, RunnerConfig
from services.scheduler.config import CoreConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.request import Req

from .proc_cpu import CpuMeter
from .sse_client import StreamTimes, stream_post


def make_prompts(batch: int, context: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed + batch)
    return rng.integers(1000, 40000, size=(batch, context)).tolist()


def check_same_setup(runner: ModelRunner, worker_log: Path) -> None:
    """Raises unless the stack's worker loaded the runner's dtype, linear kernel and KV dtype (its start-up line)."""
    want = f"({runner.config.dtype} [{runner.dtype_choice.reason}], {runner.model.linear_kernel} linears,"
    kv = f" KV in {runner.config.kv_dtype} [{runner.kv_choice.reason}],"
    text = worker_log.read_text(errors="replace")
    if not any(want in line and kv in line for line in text.splitlines()):
        loaded = [line for line in text.splitlines() if " loaded " in line]
        raise RuntimeError(f"the stack's worker does not run what the runner runs: want {want!r}, "
                           f"{kv!r}, its log says {loaded[-1] if loaded else 'nothing loaded'!r}")


def bench_in_process(runner: ModelRunner, prompts: list[list[int]], steps: int) -> float:
    info = WorkerInfo(worker_id="bench", model="m", kv_slots=runner.config.kv_slots,
                      max_requests=runner.config.max_requests, max_model_len=runner.max_model_len,
                      vocab_size=runner.vocab_size, eos_token_ids=runner.eos_token_ids,
                      dtype=runner.config.dtype)
    batcher = SchedulerCore(info, CoreConfig(chunked_prefill_size=1 << 30, enable_cache=False))
    for i, ids in enumerate(prompts):
        batcher.submit(Req(rid=f"r{i}", input_ids=ids, detok_instance="t", sampling=SamplingParams(
            max_new_tokens=steps + 1, temperature=0.0, ignore_eos=True)))

    def one_step() -> None:
        batch = batcher.next_batch()
        tokens = runner.execute(batch)
        batcher.complete(ForwardResult(step=batch.step, next_token_ids=tokens, forward_ms=0))

    one_step()  # prefill, not timed
    start = time.perf_counter()
    for _ in range(steps):
        one_step()
    elapsed = time.perf_counter() - start
    assert not batcher.has_work()
    return len(prompts) * steps / elapsed


async def _stream_one(url: str, ids: list[int], steps: int) -> StreamTimes:
    """One streamed request's events, read by the lean client (sse_client.py): a heavier one
    takes CPU from the stack it measures."""
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": steps + 1, "temperature": 0, "ignore_eos": True}}
    return await stream_post(url, "/generate", body)


def _tokens_by(times: StreamTimes, t: float) -> int:
    """Tokens the stream had delivered by ``t`` (its events are cumulative /generate objects)."""
    done = [payload for at, payload in times.events if at <= t]
    return json.loads(done[-1])["meta_info"]["completion_tokens"] if done else 0


async def bench_stack(url: str, prompts: list[list[int]], steps: int) -> float:
    """Tokens/s over the window from the last request's first token to the last token: the
    tokens each request received in that window (parsed after the run), not all it decoded,
    so a request that started decoding early adds only what fell inside."""
    results = await asyncio.gather(*(_stream_one(url, ids, steps) for ids in prompts))
    t0 = max(r.first for r in results)  # every request has its first token
    t1 = max(r.last for r in results)
    if t0 >= min(r.last for r in results):
        raise RuntimeError("a request ended before the last one had its first token: the stack did not run "
                           "the batch at once (KV slots?), so the window does not hold its decodes")
    decoded = sum(_tokens_by(r, t1) - _tokens_by(r, t0) for r in results)
    return decoded / (t1 - t0)


@dataclass
class StackRun:
    tokens_per_s: float
    idle: float  # the worker's idle share over the run (NaN: unknown)
    others: float  # cores the rest of the machine used meanwhile: the stack's other processes, the client
    client: float  # of which this process (the client)


async def measure_stack(url: str, pids: dict[str, int], prompts: list[list[int]], steps: int) -> StackRun:
    """:func:`bench_stack`, with the worker's idle share and the CPU the rest of the
    machine used meanwhile."""
    import httpx

    workers = {name: pid for name, pid in pids.items() if name.startswith("gpu_worker")}
    async with httpx.AsyncClient(base_url=url, timeout=60) as metrics:
        before = await worker_time.scrape(metrics)
        meter = CpuMeter(workers)
        meter.start()
        tokens_per_s = await bench_stack(url, prompts, steps)
        used = meter.stop()
        idle = worker_time.idle_fraction(before, await worker_time.scrape(metrics))
    return StackRun(tokens_per_s, idle, used.besides(*workers), used.cores["client"])


def sharing_bound(others: float, threads: int, cores: int) -> float:
    """The share of its in-process speed a worker of ``threads`` threads keeps on ``cores``
    cores while other processes take ``others`` cores (free cores absorb them first)."""
    return max(0.0, min(1.0, (cores - others) / threads))


def bench_hf(model, prompts: list[list[int]], steps: int) -> float:
    ids = torch.tensor(prompts)
    mask = torch.ones_like(ids)

    def run(n: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0)
        return time.perf_counter() - start

    prefill = run(1)
    full = run(steps + 1)
    if full <= prefill:  # the machine was busier during the prefill-only run
        return float("nan")
    return len(prompts) * steps / (full - prefill)


def run_sizes(batches: list[int], context: int, steps: int) -> tuple[int, list[str]]:
    """KV slots for the largest batch's prompts and decodes, and the stacks' scheduler flags that
    prefill its prompts in one step (as the in-process runner does)."""
    # NOTE: half again over what the batch holds: the scheduler admits a request only with room
    # for its prompt and expected output in whole pages on top of what runs; at exactly that
    # much, four of 64 waited and started after the others had finished
    slots = max(16384, max(batches) * (context + steps) * 3 // 2)
    return slots, ["--chunked-prefill-size", str(max(batches) * context)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--context", type=int, default=256)
    # NOTE: 128, not 32: a 32-step run at batch 1 lasts ~0.4 s and its stack figure moved
    # 0.71-0.96x of the in-process one from run to run
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 (the runner, the stacks and HF)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians reported")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    samples: dict[int, dict[str, list]] = {b: {"a": [], "b0": [], "b": [], "c": []} for b in args.batches}

    from transformers import AutoModelForCausalLM

    model = resolve_model("default")
    slots, one_step = run_sizes(args.batches, args.context, args.steps)
    runner = ModelRunner(RunnerConfig(model=str(model), kv_slots=slots, dtype=args.dtype))
    # NOTE: the stacks get the name asked for, not the runner's resolved one: on an AVX2 CPU auto
    # resolves to float32 *with bf16 weight tiles*, and "float32" asked for keeps fp32 weights
    # (the stacks ran 0.64x the runner at batch 1 that way: another kernel, not the stack's cost)
    stack_dtype, args.dtype = args.dtype, runner.config.dtype
    kv = runner.config.kv_dtype
    args.label = (runner.config.dtype + (" (bf16 weights)" if runner.dtype_choice.bf16_weights else "")
                  + (f", {kv} KV" if kv != runner.config.dtype else ""))
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, args.dtype)).eval()
    with tempfile.TemporaryDirectory() as logs:
        config = ephemeral_stack_config(Path(logs) / "b", threads_per_worker=args.threads, dtype=stack_dtype,
                                        kv_slots=slots, extra={"scheduler": one_step})
        step_by_step = ephemeral_stack_config(Path(logs) / "b0", threads_per_worker=args.threads, dtype=stack_dtype,
                                              kv_slots=slots,
                                              extra={"scheduler": ["--disable-overlap-schedule", *one_step]})
        with LocalStack(config, progress=lambda m: None) as stack, \
                LocalStack(step_by_step, progress=lambda m: None) as stack0:
            for cfg in (config, step_by_step):
                check_same_setup(runner, cfg.log_dir / "gpu_worker-0.log")
            for url in (stack.url, stack0.url):
                event_loop.run(bench_stack(url, make_prompts(1, 16, seed=99), 4))  # warm-up
            # NOTE: the systems take turns, round after round, so a slow spell of
            # this noisy machine hits all of them instead of one.
            for _ in range(args.rounds):
                for b in args.batches:
                    prompts = make_prompts(b, args.context)
                    samples[b]["a"].append(bench_in_process(runner, prompts, args.steps))
                    samples[b]["b0"].append(event_loop.run(bench_stack(stack0.url, prompts, args.steps)))
                    samples[b]["b"].append(event_loop.run(measure_stack(stack.url, stack.pids(), prompts, args.steps)))
                    samples[b]["c"].append(bench_hf(hf, prompts, args.steps))
    print_table({b: _medians(r) for b, r in samples.items()}, args)


def _medians(runs: dict[str, list]) -> dict[str, float]:
    stack: list[StackRun] = runs["b"]
    out = {k: _median(runs[k]) for k in ("a", "b0", "c")}
    out["b"] = _median([r.tokens_per_s for r in stack])
    out["idle"] = _median([r.idle for r in stack])
    out["others"] = _median([r.others for r in stack])
    out["client"] = _median([r.client for r in stack])
    return out


def _median(values: list[float]) -> float:
    finite = sorted(v for v in values if v == v)
    return finite[len(finite) // 2] if finite else float("nan")


def print_table(results: dict[int, dict[str, float]], args: argparse.Namespace) -> None:
    cores = os.cpu_count() or 1
    print(f"\ndecode tokens/s, {args.context}-token contexts, {args.steps} decode steps, "
          f"{args.label}, {args.threads} threads, {cores} cores, median of {args.rounds} interleaved rounds")
    print("| batch | (a) in-process runner | (b0) stack, step by step | (b) full stack over NATS "
          "| (c) HF generate | b/b0 | b/a | b/c | (b) worker idle | (b) other cores (client) | bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for b, r in results.items():
        bound = sharing_bound(r["others"], args.threads, cores)
        print(f"| {b} | {r['a']:.1f} | {r['b0']:.1f} | {r['b']:.1f} | {r['c']:.1f} "
              f"| {r['b'] / r['b0']:.2f} | {r['b'] / r['a']:.2f} | {r['b'] / r['c']:.2f} "
              f"| {r['idle']:.1%} | {r['others']:.2f} ({r['client']:.2f}) | {bound:.2f} |")
    print("worker idle: its waits between steps over the run, per the scheduler; other cores: the "
          "machine's CPU besides the worker meanwhile, the client's share in brackets; bound: the "
          "largest b/a those cores leave the worker's threads")


if __name__ == "__main__":
    main()
