"""What the mesh costs per decode step and per token, with the worker's forward out of the way.

    python -m radixmesh.benchmarks.mesh [--batches 1 64 256] [--steps 256] [--gateways N] [--tokenizers N]
                                        [--workers N | --pd P D]

The real stack (``radixmesh up``'s launcher, a real nats-server) serves a tiny random Llama
this module writes (tiny_model.py: 1 layer, hidden 64, the default model's tokenizer and
vocabulary), so the worker's forward takes a fraction of a millisecond and the rest of the
mesh shows. B greedy streams with ``ignore_eos`` run at once through ``/v1/completions``,
read by the leanest client there is (sse_client.drain_post: bytes counted, nothing parsed).

Each process's CPU time comes from /proc (every thread; CPU time, not wall, so it means
the same on a busy machine), the steps, tokens and the worker's forward time from each
scheduler's counters (SchedStats over the bus). Per step and per token costs are
differential: a run of ``--steps`` decode steps minus a run of ``--short-steps`` at the
same batch, so what a request costs once (HTTP, encode, route, submit, prefill, the last
body) cancels and what remains is the steady decode. Steps/s is the same difference in
wall time. The client's own CPU is reported apart.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from libs.models import served_name
from libs.protocol import event_loop
from libs.protocol.bus import Bus
from libs.protocol.messages import SchedStats, SchedStatsRequest, WorkersReply, WorkersRequest
from libs.protocol.subjects import Subjects
from radixmesh.launcher import LocalStack, ephemeral_stack_config

from . import mesh_table
from .proc_cpu import cpu_seconds
from .sse_client import drain_post
from .tiny_model import write_tiny_llama

SETTLE_S = 0.3  # after the last stream ends: the finishes' bookkeeping (KV events, releases)


@dataclass
class Reading:
    """Counters at one moment: CPU seconds by process (and "client"), the schedulers' sums."""

    wall: float
    cpu: dict[str, float]
    steps: int
    tokens: int
    forward_s: float

    def minus(self, other: Reading) -> Reading:
        return Reading(self.wall - other.wall, {k: v - other.cpu[k] for k, v in self.cpu.items()},
                       self.steps - other.steps, self.tokens - other.tokens, self.forward_s - other.forward_s)

    def less_idle(self, idle: Reading) -> Reading:
        """Each process's CPU less what it uses idle over as long (``idle``: a difference
        over a quiet spell): load reports, leases, pings, its broker's heartbeats."""
        cpu = {k: v - (idle.cpu[k] / idle.wall * self.wall if k != "client" else 0.0)
               for k, v in self.cpu.items()}
        return Reading(self.wall, cpu, self.steps, self.tokens, self.forward_s)


class Probe:
    """Reads a running stack's counters."""

    def __init__(self, stack: LocalStack, bus: Bus, workers: list[str]) -> None:
        self.pids = {name: pid for name, pid in stack.pids().items()}
        self.bus, self.workers = bus, workers
        self.subjects = Subjects(stack.config.subject_prefix)

    async def read(self) -> Reading:
        stats = [await self.bus.request(self.subjects.sched_stats(w), SchedStatsRequest(), SchedStats)
                 for w in self.workers]
        cpu = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        cpu["client"] = time.process_time()
        return Reading(time.perf_counter(), cpu, sum(s.steps for s in stats),
                       sum(s.tokens_generated for s in stats), sum(s.worker_busy_s for s in stats))


async def run_streams(url: str, model: str, probe: Probe, prompts: list[list[int]], steps: int) -> Reading:
    """Every prompt streamed at once for ``steps`` tokens; the counters' difference over the run."""
    before = await probe.read()
    bodies = [{"model": model, "prompt": ids, "max_tokens": steps, "temperature": 0, "ignore_eos": True,
               "stream": True} for ids in prompts]
    await asyncio.gather(*(drain_post(url, "/v1/completions", b) for b in bodies))
    await asyncio.sleep(SETTLE_S)
    return (await probe.read()).minus(before)


def make_prompts(batch: int, tokens: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(1000, 40000, size=(batch, tokens)).tolist()


async def measure(stack: LocalStack, model: str, args: argparse.Namespace) -> dict[int, list[Reading]]:
    """Per batch, one steady-decode Reading (long run minus short run) per round."""
    bus = await Bus.connect(stack.nats_url, "bench-mesh")
    try:
        workers = await _workers(bus, Subjects(stack.config.subject_prefix), stack)
        probe = Probe(stack, bus, workers)
        await run_streams(stack.url, model, probe, make_prompts(4, args.prompt_tokens, 99), 16)  # warm-up
        await settle(probe)
        idle = await quiet(probe, args.idle_s)
        out: dict[int, list[Reading]] = {b: [] for b in args.batches}
        for r in range(args.rounds):
            for b in args.batches:
                prompts = make_prompts(b, args.prompt_tokens, seed=r * 1000 + b)
                short = await run_streams(stack.url, model, probe, prompts, args.short_steps)
                long = await run_streams(stack.url, model, probe, [p[::-1] for p in prompts], args.steps)
                out[b].append(long.minus(short).less_idle(idle) if idle else long.minus(short))
        args.idle = idle
        return out
    finally:
        await bus.close()


async def settle(probe: Probe, busy_ms_per_s: float = 50.0, limit_s: float = 60.0) -> None:
    """Wait until no process uses more than ``busy_ms_per_s`` of CPU (a second tokenizer or
    gateway may still be loading after the first answered: its start-up is no idle cost)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        spell = await quiet(probe, 0.5)
        if all(v / spell.wall * 1e3 <= busy_ms_per_s for k, v in spell.cpu.items() if k != "client"):
            return
    print(f"note: the stack did not settle within {limit_s:.0f}s; idle costs may include start-up work")


async def quiet(probe: Probe, seconds: float) -> Reading | None:
    """The counters' difference over ``seconds`` with no request (None: not measured)."""
    if seconds <= 0:
        return None
    before = await probe.read()
    await asyncio.sleep(seconds)
    return (await probe.read()).minus(before)


async def _workers(bus: Bus, subjects: Subjects, stack: LocalStack) -> list[str]:
    """Every worker's id, once all have joined (a prefill worker's steps and tokens are the
    same in the long and the short run, so they cancel)."""
    want = stack.config.workers + stack.config.decode_workers + stack.config.prefill_workers
    for _ in range(200):
        reply = await bus.request(subjects.index_workers(), WorkersRequest(), WorkersReply)
        if len(reply.workers) >= want:
            break
        await asyncio.sleep(0.1)
    return sorted(w.worker_id for w in reply.workers)


def _workers_of(args: argparse.Namespace) -> dict[str, int]:
    if args.pd is None:
        return {"workers": args.workers}
    return {"workers": 0, "prefill_workers": args.pd[0], "decode_workers": args.pd[1]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--steps", type=int, default=256, help="decode steps of the long run")
    p.add_argument("--short-steps", type=int, default=64, help="decode steps of the short run (subtracted)")
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--gateways", type=int, default=1)
    p.add_argument("--tokenizers", type=int, default=1)
    p.add_argument("--workers", type=int, default=1, help="colocated workers (prefill and decode)")
    p.add_argument("--pd", type=int, nargs=2, default=None, metavar=("P", "D"),
                   help="P prefill and D decode workers instead of colocated ones")
    p.add_argument("--threads", type=int, default=1, help="threads per worker")
    p.add_argument("--rounds", type=int, default=2, help="rounds over the batches; medians reported")
    p.add_argument("--idle-s", type=float, default=5.0,
                   help="a quiet spell measured first; each process's idle CPU over a run's wall time is "
                        "subtracted from its run (0: not measured, nothing subtracted)")
    p.add_argument("--keep-logs", type=Path, default=None, help="the stack's log folder (default: a temporary one)")
    args = p.parse_args(argv)
    if args.short_steps >= args.steps:
        p.error("--short-steps must be below --steps")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_tiny_llama(Path(tmp) / "tiny-llama")
        biggest = max(args.batches)
        slots = max(16384, biggest * (args.prompt_tokens + args.steps) * 2)
        config = ephemeral_stack_config(
            args.keep_logs or Path(tmp) / "logs", model=str(model_dir), threads_per_worker=args.threads,
            kv_slots=slots, gateways=args.gateways, tokenizers=args.tokenizers, **_workers_of(args),
            extra={"scheduler": ["--chunked-prefill-size", str(max(2048, biggest * args.prompt_tokens))]})
        with LocalStack(config, progress=lambda m: None) as stack:
            results = event_loop.run(measure(stack, served_name(str(model_dir)), args))
    mesh_table.print_tables(results, args)


if __name__ == "__main__":
    main()
