"""The systems a run compares, and how each one is run on a workload.

- ``radixmesh``: the stack (started here, or the gateway at ``--url``);
- ``radixmesh-no-cache``: a stack started with the scheduler's prefix cache off;
- ``radixmesh-no-overlap``: a stack whose scheduler plans each step after the
  previous one's result (``--disable-overlap-schedule``);
- ``hf-generate``: HF transformers ``generate`` in-process, sequentially;
- ``radixmesh-host-tier``: a stack whose workers keep a host KV pool of
  ``HOST_TIER_RATIO`` x their device pool (the host tier: evicted prefixes are
  demoted there and loaded back);
- ``radixmesh-store-tier``: the host tier plus the shared store (L3, the stack's
  JetStream); the run starts after one request per document filled the store and
  the workers were restarted empty (warm_store.py): their first hit on each
  document comes from the store;
- ``radixmesh-pd``: a stack of as many workers as ``--workers`` (at least 2),
  half of them prefill workers and the rest decode workers, which move each
  request's KV from one to the other (prefill/decode disaggregation);
- ``radixmesh-pd-<P>p<D>d``: a stack of ``P`` prefill and ``D`` decode workers
  whatever ``--workers`` says (e.g. ``radixmesh-pd-2p1d``: more prefill capacity);
- ``radixmesh-index<N>``: a stack whose cache index runs as ``N`` active replicas
  (``--index-replicas N``; e.g. ``radixmesh-index2``);
- ``radixmesh-index<N>-kill`` (N >= 2): the same, with the replica ``cache_index-1``
  SIGKILLed when half the timed requests were sent (the supervisor restarts it);
- ``radixmesh-<policy>``: a stack whose cache index routes with ``<policy>``
  (``cache_aware``, ``round_robin``, ``least_load``, ``random``, ``prefix_hash``);
- ``openai=<URL>`` (``<label>:openai=<URL>``): a peer, any OpenAI-compatible server
  already running there (vLLM, SGLang, llama.cpp, another radixmesh): peer.py.
"""

from __future__ import annotations

import asyncio
import functools
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, NamedTuple

import httpx

from . import worker_time
from .client import ClientConfig, StreamClient
from .errors import BenchError
from .peer import PeerInfo, parse_peer
from .record import Record
from .runner import Load, Progress, run_workload
from .tokens import ChatTokenizer
from .transfers import Transfers, read_counters
from .warm_store import WarmStoreError, warm_store
from .workload import Workload
from .workloads import RandomParams, build_random

SYSTEMS = ("radixmesh", "radixmesh-no-cache", "radixmesh-no-overlap", "radixmesh-host-tier",
           "radixmesh-store-tier", "radixmesh-pd", "hf-generate")
TIERED = ("radixmesh-host-tier", "radixmesh-store-tier")
HOST_TIER_RATIO = 3
ROUTING_POLICIES = ("cache_aware", "round_robin", "least_load", "random", "prefix_hash")
INDEXED = ("radixmesh-index<N> (N index replicas)", "radixmesh-index<N>-kill (N >= 2, one killed mid-run)")
DEFAULT_SYSTEMS = ("radixmesh", "radixmesh-no-cache", "hf-generate")
NO_CACHE_FLAG = "--disable-radix-cache"
NO_OVERLAP_FLAG = "--disable-overlap-schedule"
PD_COUNTS = re.compile(r"radixmesh-pd-(\d+)p(\d+)d")  # radixmesh-pd-<P>p<D>d
INDEX_REPLICAS = re.compile(r"radixmesh-index(\d+)(-kill)?")  # radixmesh-index<N>[-kill]
KILLED_REPLICA = "cache_index-1"
_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class SystemPlan:
    name: str
    kind: str  # "url" | "stack" | "hf" | "peer"
    scheduler_flags: tuple[str, ...] = ()
    index_flags: tuple[str, ...] = ()
    host_ratio: int = 0  # workers get a host KV pool of this many times their device pool
    store: bool = False  # and the shared store, warm, with the workers restarted empty
    stack: tuple[tuple[str, int], ...] = ()  # StackConfig fields over the run's (worker roles)
    url: str = ""  # a peer's base URL
    peer: PeerInfo | None = None  # what check_peer found (before the run)
    kill: str = ""  # a process SIGKILLed when half the timed requests were sent

    def layout(self, workers: int) -> str:
        """The worker processes it runs, e.g. "2 colocated", "1 prefill + 1 decode"."""
        counts = {"workers": workers, **dict(self.stack)}
        parts = [f"{counts[k]} {name}" for k, name in (
            ("workers", "colocated"), ("prefill_workers", "prefill"),
            ("decode_workers", "decode")) if counts.get(k)]
        return " + ".join(parts)


class RunResult(NamedTuple):
    records: list[Record]
    duration_s: float
    worker_idle: float  # NaN: unknown
    transfers: Transfers | None = None  # None: not measured (no stack of the harness's)


@dataclass
class Plan:
    systems: list[SystemPlan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def scheduler_supports(flag: str) -> bool:
    """Whether ``python -m services.scheduler --help`` lists ``flag``."""
    try:
        out = subprocess.run([sys.executable, "-m", "services.scheduler", "--help"],
                             capture_output=True, text=True, timeout=120, cwd=_REPO)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return flag in out.stdout


def pd_split(workers: int) -> tuple[tuple[str, int], ...]:
    """``workers`` processes as prefill + decode workers (the decode side gets the odd one)."""
    return (("workers", 0), ("prefill_workers", workers // 2),
            ("decode_workers", workers - workers // 2))


def _pd_counts(name: str) -> tuple[tuple[str, int], ...]:
    """``radixmesh-pd-<P>p<D>d`` as a stack layout (P, D >= 1); () for any other name."""
    m = PD_COUNTS.fullmatch(name)
    if m is None or not (int(m[1]) and int(m[2])):
        return ()
    return (("workers", 0), ("prefill_workers", int(m[1])), ("decode_workers", int(m[2])))


def _index_replicas(name: str) -> tuple[tuple[str, int], ...]:
    """``radixmesh-index<N>[-kill]`` as a stack layout (N >= 1, N >= 2 with -kill); ()
    for any other name."""
    m = INDEX_REPLICAS.fullmatch(name)
    if m is None or int(m[1]) < (2 if m[2] else 1):
        return ()
    return (("index_replicas", int(m[1])),)


def _plan_pd(plan: Plan, url: str | None, workers: int) -> None:
    if url:
        plan.notes.append("radixmesh-pd skipped: it needs a stack started by the harness")
    elif workers < 2:
        plan.notes.append("radixmesh-pd skipped: it splits --workers into prefill and decode "
                          "workers (as many processes as the colocated systems): use "
                          "--workers 2 or more")
    else:
        plan.systems.append(SystemPlan("radixmesh-pd", "stack", stack=pd_split(workers)))


def plan_systems(wanted: list[str], url: str | None, workers: int = 1) -> Plan:
    plan = Plan()
    routed = {f"radixmesh-{p}": p for p in ROUTING_POLICIES}
    peers = _peers(wanted, (*SYSTEMS, *routed))
    unknown = sorted(set(wanted) - set(SYSTEMS) - set(routed) - set(filter(_pd_counts, wanted))
                     - set(filter(_index_replicas, wanted)) - set(peers))
    if unknown:
        raise BenchError(f"unknown system(s) {unknown}; choose from "
                         f"{[*SYSTEMS, *routed, 'radixmesh-pd-<P>p<D>d (P, D >= 1)', *INDEXED, '[LABEL:]openai=URL']}")
    for name in wanted:
        if name in peers:
            plan.systems.append(SystemPlan(peers[name].label, "peer", url=peers[name].url))
        elif _index_replicas(name):
            if url:
                plan.notes.append(f"{name} skipped: it needs a stack started by the harness")
            elif name.endswith("-kill"):
                plan.systems.append(SystemPlan(name, "stack", stack=_index_replicas(name),
                                               kill=KILLED_REPLICA))
                plan.notes.append(f"{name}: {KILLED_REPLICA} was SIGKILLed when half the timed "
                                  "requests were sent (then restarted by the stack's supervisor)")
            else:
                plan.systems.append(SystemPlan(name, "stack", stack=_index_replicas(name)))
        elif _pd_counts(name):
            if url:
                plan.notes.append(f"{name} skipped: it needs a stack started by the harness")
            else:
                plan.systems.append(SystemPlan(name, "stack", stack=_pd_counts(name)))
        elif name in routed:
            if url:
                plan.notes.append(f"{name} skipped: it needs a stack started by the harness")
            else:
                plan.systems.append(SystemPlan(name, "stack", index_flags=("--policy", routed[name])))
        elif name == "radixmesh":
            plan.systems.append(SystemPlan(name, "url" if url else "stack"))
        elif name == "radixmesh-no-cache":
            if url:
                plan.notes.append("radixmesh-no-cache skipped: it needs a stack started by the "
                                  "harness (no --url)")
            elif not scheduler_supports(NO_CACHE_FLAG):
                plan.notes.append(f"radixmesh-no-cache skipped: the scheduler has no "
                                  f"{NO_CACHE_FLAG} flag yet (no prefix cache to turn off)")
            else:
                plan.systems.append(SystemPlan(name, "stack", (NO_CACHE_FLAG,)))
        elif name == "radixmesh-pd":
            _plan_pd(plan, url, workers)
        elif name in ("radixmesh-no-overlap", *TIERED):
            if url:
                plan.notes.append(f"{name} skipped: it needs a stack started by the harness")
            elif name == "radixmesh-no-overlap":
                plan.systems.append(SystemPlan(name, "stack", (NO_OVERLAP_FLAG,)))
            else:
                store = name == "radixmesh-store-tier"
                plan.systems.append(SystemPlan(name, "stack", host_ratio=HOST_TIER_RATIO, store=store))
                if store:
                    plan.notes.append(f"{name}: one request per document filled the shared store, then "
                                      "its workers were restarted empty; its hit rate is not bounded "
                                      "by the workload's ideal (a cold start's)")
        else:
            plan.systems.append(SystemPlan(name, "hf"))
    return plan


def _peers(wanted: list[str], taken: tuple[str, ...]) -> dict:
    """The peers among ``wanted`` (system text -> PeerSpec), their labels distinct."""
    peers = {name: spec for name in wanted if (spec := parse_peer(name, taken))}
    labels = [spec.label for spec in peers.values()]
    twice = sorted({x for x in labels if labels.count(x) > 1 or _pd_counts(x)})
    if twice or len(peers) < sum(1 for name in wanted if name in peers):
        raise BenchError(f"peer label(s) {twice or labels} used twice or taken: give each "
                         "peer its own LABEL:openai=URL")
    return peers


async def served_model(http: httpx.AsyncClient) -> str:
    resp = await http.get("/v1/models")
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


Counters = Callable[[], Awaitable[Transfers | None]]
Prepare = Callable[[StreamClient], Awaitable[object]]


async def bench_http(url: str, system: str, workload: Workload, tok: ChatTokenizer,
                     client: ClientConfig, load: Load, warmup: int, timeout_s: float,
                     progress: Progress | None = None, counters: Counters | None = None,
                     prepare: Prepare | None = None,
                     on_send: Callable[[int], object] | None = None) -> RunResult:
    """``prepare`` (untimed), warm up, then run ``workload`` against the gateway at
    ``url``; returns the records, the duration, the workers' idle fraction meanwhile
    (NaN: unknown) and, given ``counters``, the KV transfers meanwhile. ``on_send(n)``
    runs as the n-th timed request is sent (n from 1)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as http:
        if client.api == "chat" and not client.model:
            client = ClientConfig(**{**client.__dict__, "model": await served_model(http)})
        stream = StreamClient(http, tok, client)
        if prepare is not None:
            await prepare(stream)
        await _warm_up(stream, tok, warmup, load.seed)

        sent = 0

        async def send(spec, messages, record, index):
            nonlocal sent
            sent += 1
            if on_send is not None:
                on_send(sent)
            await stream.send(messages, spec.max_tokens, record, index)

        moved = counters and await counters()
        before = await worker_time.scrape(http)
        records, duration = await run_workload(workload, system, send, load, progress)
        idle = worker_time.idle_fraction(before, await worker_time.scrape(http))
        after = counters and await counters()
        return RunResult(records, duration, idle, after.since(moved) if moved and after else None)


async def _warm_up(stream: StreamClient, tok: ChatTokenizer, count: int, seed: int) -> None:
    """``count`` short unrelated requests (they share no prefix with the workload)."""
    if count <= 0:
        return
    params = RandomParams(requests=count, min_prompt_tokens=32, max_prompt_tokens=64, max_tokens=8)
    for spec in build_random(params, seed + 1_000_003, tok).requests:
        record = Record("warmup", spec.id, spec.kind)
        await stream.send(spec.render({}), spec.max_tokens, record)
        if not record.ok:
            raise BenchError(f"warm-up request failed: {record.error}")


def run_stack(plan: SystemPlan, stack_kwargs: dict, log_dir: Path, startup_timeout: float,
              **bench_kwargs) -> RunResult:
    """Start a private stack for ``plan``, run the workload on it, read its KV transfer
    counters, stop it."""
    from radixmesh.launcher import LocalStack, StackError, ephemeral_stack_config

    extra = {}
    if plan.scheduler_flags:
        extra["scheduler"] = list(plan.scheduler_flags)
    if plan.index_flags:
        extra["cache_index"] = list(plan.index_flags)
    if plan.host_ratio:
        extra["gpu_worker"] = ["--host-kv-slots", str(plan.host_ratio * stack_kwargs["kv_slots"]),
                               *(["--kv-store", "nats"] if plan.store else [])]
    config = ephemeral_stack_config(log_dir, extra=extra, **{**stack_kwargs, **dict(plan.stack)})
    stack = LocalStack(config, progress=lambda msg: None)
    try:
        stack.start(timeout=startup_timeout)
        counters = functools.partial(read_counters, stack.nats_url, config.subject_prefix)
        prepare = on_send = None
        if plan.kill:
            on_send = functools.partial(_kill_at_half, stack, plan,
                                        len(bench_kwargs["workload"].requests))
        if plan.store:
            prepare = functools.partial(warm_store, stack, workload=bench_kwargs["workload"],
                                        limit_s=startup_timeout)
        return asyncio.run(bench_http(stack.url, plan.name, counters=counters, prepare=prepare,
                                      on_send=on_send, **bench_kwargs))
    except WarmStoreError as exc:
        raise BenchError(f"{plan.name}: {exc}") from None
    except StackError as exc:
        raise BenchError(f"{plan.name}: {exc}") from None
    finally:
        stack.stop()


def _kill_at_half(stack, plan: SystemPlan, total: int, sent: int) -> None:
    """SIGKILL ``plan.kill`` as the ``ceil(total / 2)``-th timed request is sent."""
    if sent == (total + 1) // 2:
        pid = stack.kill(plan.kill)
        print(f"[{plan.name}] SIGKILLed {plan.kill} (pid {pid}) as request {sent} of {total} "
              "was sent", file=sys.stderr, flush=True)
