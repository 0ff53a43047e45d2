"""Routing policies: pick a worker for a request among the live ones.

``cache_aware`` scores each worker in seconds: the predicted time to first token
(prefill tokens queued there plus this request's uncached ones, over the
worker's measured prefill rate, plus its host-tier tokens over its measured
load-back rate, plus one decode step) plus the cost of the recomputation itself
(uncached tokens over the rate: capacity every later request loses). Every tier
is credited at the worker's own measured cost, never a fixed weight. If the worker it prefers is badly overloaded compared with the
least-loaded one it falls back to least-load, so a hot prefix cannot pile
everything onto one worker. (The guard looks at the preferred worker only: in
a large cluster some worker is nearly always idle, and a cluster-wide spread
test would switch affinity off almost always.)
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Callable

from .registry import WorkerState

DEFAULT_PREFILL_TPS = 500.0  # until a worker has measured its own
HOST_LOAD_SPEEDUP = 10.0  # until then a host-tier load counts as this much faster than prefill
STORE_SPEEDUP = 10.0  # and a shared-store fetch (the scheduler assumes the same: store_tier.py)
BALANCE_ABS = 16  # the preferred worker's load exceeds the least-loaded one's by this ...
BALANCE_REL = 2.0  # ... and by this ratio: route least-loaded instead


@dataclass
class Candidate:
    state: WorkerState
    cached: int  # prompt tokens this worker holds on the device (index view + bookings)
    load: int  # running + waiting + booked requests
    queued_tokens: int  # prefill tokens ahead of this request
    score: float = 0.0  # seconds: predicted TTFT + recomputation cost
    cached_host: int = 0  # further prompt tokens in its host tier (loaded back, not computed)
    cached_store: int = 0  # further prompt tokens in the shared store (fetched, not computed)

    @property
    def worker_id(self) -> str:
        return self.state.report.worker_id


Policy = Callable[[list[Candidate], int, int], Candidate]  # (candidates, num_tokens, key)


def predict_ttft(c: Candidate, num_tokens: int) -> float:
    report = c.state.report
    rate = report.prefill_tps or DEFAULT_PREFILL_TPS
    load_rate = report.host_load_tps or HOST_LOAD_SPEEDUP * rate
    store_rate = report.store_load_tps or STORE_SPEEDUP * rate
    return ((c.queued_tokens + computed(c, num_tokens)) / rate + c.cached_host / load_rate
            + c.cached_store / store_rate + report.decode_step_s)


def computed(c: Candidate, num_tokens: int) -> int:
    """Prompt tokens the worker would compute: those in none of its tiers."""
    return num_tokens - c.cached - c.cached_host - c.cached_store


def score(c: Candidate, num_tokens: int) -> float:
    rate = c.state.report.prefill_tps or DEFAULT_PREFILL_TPS
    return predict_ttft(c, num_tokens) + computed(c, num_tokens) / rate


def least_load(cands: list[Candidate], num_tokens: int, key: int) -> Candidate:
    """Fewest requests (running + queued + booked), then most free KV slots."""
    return min(cands, key=lambda c: (c.load, -c.state.report.free_slots, random.random()))


def cache_aware(cands: list[Candidate], num_tokens: int, key: int) -> Candidate:
    best = min(cands, key=lambda c: (c.score, c.load, random.random()))
    lightest = min(c.load for c in cands)
    if best.load - lightest > BALANCE_ABS and best.load > BALANCE_REL * max(lightest, 1):
        return least_load(cands, num_tokens, key)
    return best


def prefix_hash(cands: list[Candidate], num_tokens: int, key: int) -> Candidate:
    """Rendezvous hash of the prompt's first pages: stable as workers come and go."""

    def weight(c: Candidate) -> int:
        digest = hashlib.blake2b(f"{key}:{c.worker_id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    return max(cands, key=weight)


def random_choice(cands: list[Candidate], num_tokens: int, key: int) -> Candidate:
    return random.choice(cands)


def round_robin_factory() -> Policy:
    counter = 0

    def round_robin(cands: list[Candidate], num_tokens: int, key: int) -> Candidate:
        nonlocal counter
        counter += 1
        ordered = sorted(cands, key=lambda c: c.worker_id)
        return ordered[counter % len(ordered)]

    return round_robin


POLICIES: dict[str, Callable[[], Policy]] = {
    "cache_aware": lambda: cache_aware,
    "least_load": lambda: least_load,
    "round_robin": round_robin_factory,
    "random": lambda: random_choice,
    "prefix_hash": lambda: prefix_hash,
}
