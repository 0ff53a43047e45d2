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

A worker that will decode the request (colocated or decode) also pays its decode load
when the request names its output cap: the request's own steps at the batch it joins
plus what its row adds to the steps of the rows already there (``decode_cost``, from
the worker's measured step time and growth per row), over at most
``DECODE_HORIZON_TOKENS`` steps; a worker without free KV for the prompt's uncached
part and that output is picked only when none has room. So decode streams spread over
decode workers, while one holding the prompt's prefix keeps it unless its batch is
much larger.

A decode worker that will leave the prompt to a prefill peer (at least its
``remote_prefill_min_tokens`` uncached there) is scored as the pair: the peer's score
(its queue, its own prefix hit, its compute) plus the prompt's KV beyond the decode
worker's cached prefix moved in at the decode worker's transfer rate (``pair_score``).
There its cached prefix saves only those bytes (~77 us a token in fp32 over NATS),
not a prefill (~1-2 ms a token on one CPU thread), so it no longer outweighs decode load.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from statistics import fmean
from typing import Callable, Iterable

from libs.protocol.messages import LoadReport

from .registry import WorkerState

DEFAULT_PREFILL_TPS = 500.0  # until a worker has measured its own
HOST_LOAD_SPEEDUP = 10.0  # until then a host-tier load counts as this much faster than prefill
STORE_SPEEDUP = 10.0  # and a shared-store fetch (the scheduler assumes the same: store_tier.py)
BALANCE_ABS = 16  # the preferred worker's load exceeds the least-loaded one's by this ...
BALANCE_REL = 2.0  # ... and by this ratio: route least-loaded instead
# until a worker and all its peers measured them: a decode step of one row and what each
# further row adds (SmolLM2-135M fp32, one CPU thread: ~48 ms at 1 row, ~107 ms at 8)
DEFAULT_DECODE_STEP_S = 0.05
DEFAULT_DECODE_ROW_S = 0.008
# until a decode worker reports its rate: 0.6 GB/s (NATS chunks, one host) over 46 KB a
# token (SmolLM2-135M fp32; the scheduler assumes the same: transfer_rates.py)
DEFAULT_TRANSFER_TPS = 13_000.0
# steps over which the rows a load report shows are assumed to stay: they finish and
# others arrive, so a longer output does not make today's batch weigh more
DECODE_HORIZON_TOKENS = 128


@dataclass
class Candidate:
    state: WorkerState
    cached: int  # prompt tokens this worker holds on the device (index view + bookings)
    load: int  # running + waiting + booked requests
    queued_tokens: int  # prefill tokens ahead of this request
    score: float = 0.0  # seconds: predicted TTFT + recomputation cost + decode load (pair_score)
    cached_host: int = 0  # further prompt tokens in its host tier (loaded back, not computed)
    cached_store: int = 0  # further prompt tokens in the shared store (fetched, not computed)
    decode_s: float = 0.0  # seconds: the decode load it would add there (decode_cost)
    fits: bool = True  # its free KV holds the uncached prompt and the output

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
    return predict_ttft(c, num_tokens) + computed(c, num_tokens) / rate + c.decode_s


def prefills_remotely(c: Candidate, num_tokens: int) -> bool:
    """Whether ``c``, a decode worker, leaves the prompt to a prefill peer (as its
    scheduler decides: tokens in neither its device nor its host tier)."""
    report = c.state.report
    return (report.role == "decode"
            and num_tokens - c.cached - c.cached_host >= report.remote_prefill_min_tokens)


def pair_score(c: Candidate, peer: Candidate, num_tokens: int) -> float:
    """Seconds for decode worker ``c`` with prefill peer ``peer`` (scored): the peer's
    predicted TTFT and compute, the KV beyond ``c``'s cached prefix moved in at ``c``'s
    transfer rate (its host-tier part loaded back), one decode step, the decode load."""
    report = c.state.report
    rate = report.prefill_tps or DEFAULT_PREFILL_TPS
    load_rate = report.host_load_tps or HOST_LOAD_SPEEDUP * rate
    return peer.score + transfer_s(c, num_tokens) + c.cached_host / load_rate + report.decode_step_s + c.decode_s


def transfer_s(c: Candidate, num_tokens: int) -> float:
    """Seconds to move in the KV of the prompt beyond decode worker ``c``'s cached prefix."""
    report = c.state.report
    return (num_tokens - c.cached - c.cached_host) / (report.transfer_tps or DEFAULT_TRANSFER_TPS)


def prefills_locally_instead(c: Candidate, peer: Candidate, num_tokens: int, factor: float) -> bool:
    """Whether decode worker ``c`` should prefill the prompt itself rather than wait for
    ``peer``: the pair's predicted first token (the peer's queue and compute, then the KV
    moved) is over ``factor`` times its own (its queue and compute; an unmeasured decode
    worker is assumed to prefill at its peer's measured rate: the same KV layout)."""
    report = c.state.report
    rate = report.prefill_tps or peer.state.report.prefill_tps or DEFAULT_PREFILL_TPS
    own = (c.queued_tokens + num_tokens - c.cached - c.cached_host) / rate + report.decode_step_s
    return predict_ttft(peer, num_tokens) + transfer_s(c, num_tokens) > factor * own


@dataclass(frozen=True)
class DecodePrior:
    """What an unmeasured worker's decode steps are assumed to cost: its measured peers'
    mean, else the defaults."""

    step_s: float = DEFAULT_DECODE_STEP_S  # a step of one row
    row_s: float = DEFAULT_DECODE_ROW_S  # what each further row adds

    @classmethod
    def of(cls, reports: Iterable[LoadReport]) -> DecodePrior:
        measured = [r for r in reports if r.decode_step_s > 0]
        rows = [r.decode_row_s for r in measured if r.decode_row_s > 0]
        row_s = fmean(rows) if rows else DEFAULT_DECODE_ROW_S
        steps = [r.decode_step_s - (_rows(r) - 1) * (r.decode_row_s or row_s) for r in measured]
        return cls(max(fmean(steps), 0.0) if steps else DEFAULT_DECODE_STEP_S, row_s)


def _rows(report: LoadReport) -> int:
    """The rows its measured decode step ran with, about (an EMA over recent steps)."""
    return max(report.running, 1)


def decode_cost(c: Candidate, out_tokens: int, prior: DecodePrior) -> float:
    """Seconds of decoding the request adds on ``c`` over ``out_tokens`` steps: its own
    steps at the batch it joins, plus its row's share of every step of the rows already
    there (``c.load``: running, waiting and booked requests all decode there)."""
    if out_tokens <= 0:
        return 0.0
    report = c.state.report
    row_s = report.decode_row_s or prior.row_s
    step_s = report.decode_step_s or (prior.step_s + (_rows(report) - 1) * row_s)
    joined = step_s + (c.load + 1 - _rows(report)) * row_s
    return out_tokens * (joined + c.load * row_s)


def least_load(cands: list[Candidate], num_tokens: int, key: int) -> Candidate:
    """Fewest requests (running + queued + booked), then most free KV slots."""
    return min(cands, key=lambda c: (c.load, -c.state.report.free_slots, random.random()))


def cache_aware(cands: list[Candidate], num_tokens: int, key: int) -> Candidate:
    cands = [c for c in cands if c.fits] or cands
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
