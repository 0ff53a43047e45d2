"""Per-system summary statistics over request records."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .record import Record


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); NaN for no values."""
    if len(values) == 0:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=float), q))


@dataclass
class Summary:
    system: str
    completed: int
    failed: int
    duration_s: float
    request_throughput: float  # completed requests / s
    output_throughput: float  # completion tokens / s
    input_throughput: float  # prompt tokens / s
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    e2e_p50_ms: float
    e2e_p90_ms: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cache_hit_rate: float  # cached prompt tokens / prompt tokens
    host_hit_rate: float = 0.0  # of the prompt tokens: loaded back from the host tier
    store_hit_rate: float = 0.0  # of the prompt tokens: fetched from the shared store (L3)
    worker_idle: float = math.nan  # share of the run the workers waited between steps
    tpot_p99_ms: float = math.nan
    start: str = "-"  # the prefix cache when timing started: "cold" (empty), "warm", "-" (none)


def summarize(system: str, records: list[Record], duration_s: float,
              worker_idle: float = math.nan) -> Summary:
    """Summary of ``records`` (all of one system) measured over ``duration_s`` seconds."""
    ok = [r for r in records if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [t for r in ok if (t := r.tpot_s) is not None]
    itl = [g for r in ok for g in r.itl_s]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    from_host = sum(r.cached_host_tokens for r in ok)
    from_store = sum(r.cached_store_tokens for r in ok)
    completion = sum(r.completion_tokens for r in ok)
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: math.nan)
    ms = lambda values, q: percentile(values, q) * 1000  # noqa: E731
    return Summary(
        system=system, completed=len(ok), failed=len(records) - len(ok), duration_s=duration_s,
        request_throughput=per_s(len(ok)), output_throughput=per_s(completion),
        input_throughput=per_s(prompt),
        ttft_p50_ms=ms(ttft, 50), ttft_p90_ms=ms(ttft, 90), ttft_p99_ms=ms(ttft, 99),
        tpot_p50_ms=ms(tpot, 50), tpot_p90_ms=ms(tpot, 90),
        itl_p50_ms=ms(itl, 50), itl_p99_ms=ms(itl, 99),
        e2e_p50_ms=ms(e2e, 50), e2e_p90_ms=ms(e2e, 90),
        prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion,
        cache_hit_rate=cached / prompt if prompt and any(r.cached_reported for r in ok) else math.nan,
        host_hit_rate=from_host / prompt if prompt else math.nan,
        store_hit_rate=from_store / prompt if prompt else math.nan, worker_idle=worker_idle,
        tpot_p99_ms=ms(tpot, 99),
    )


def summarize_by_kind(system: str, records: list[Record],
                      duration_s: float) -> list[tuple[str, Summary]]:
    """One summary per request kind (a workload's classes), in order of first appearance;
    throughputs are over the whole run's ``duration_s``."""
    kinds = dict.fromkeys(r.kind for r in records)
    return [(k, summarize(system, [r for r in records if r.kind == k], duration_s))
            for k in kinds]
