"""Per-policy summary of a simulated run, as a markdown table or JSON."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .engine import RunResult
from .model import ServiceModel
from .trace import Trace


@dataclass
class Summary:
    policy: str
    requests: int
    hit_rate: float  # cached prompt tokens / prompt tokens
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    e2e_mean_s: float
    throughput_rps: float  # requests / makespan
    makespan_s: float
    served_max: int
    served_min: int
    served_cv: float  # coefficient of variation of requests served per worker
    prefill_tokens: int  # prompt tokens actually computed, all workers
    busy_mean: float  # mean fraction of the makespan a worker spent stepping
    ttft_pred_err_p50_s: float  # |router's predicted TTFT - simulated TTFT|, median
    resyncs: int
    retractions: int  # requests the real core retracted to make room for decodes
    wall_s: float
    route_ms_mean: float  # wall time of one Router.route call

    @property
    def spread(self) -> float:
        return self.served_max / self.served_min if self.served_min else math.inf


def summarize(run: RunResult) -> Summary:
    reqs = run.requests
    ttft = np.array([r.first_token_at - r.arrival for r in reqs])
    e2e = np.array([r.finished_at - r.arrival for r in reqs])
    prompt = sum(r.prompt_len for r in reqs)
    served = np.array([w.served for w in run.workers])
    err = np.abs(np.array([r.predicted_ttft for r in reqs]) - ttft)
    makespan = run.makespan_s
    pct = lambda q: float(np.percentile(ttft, q)) if len(reqs) else math.nan  # noqa: E731
    return Summary(
        policy=run.policy, requests=len(reqs),
        hit_rate=sum(r.cached for r in reqs) / prompt if prompt else math.nan,
        ttft_p50_s=pct(50), ttft_p90_s=pct(90), ttft_p99_s=pct(99),
        e2e_mean_s=float(e2e.mean()) if len(reqs) else math.nan,
        throughput_rps=len(reqs) / makespan if makespan else math.nan, makespan_s=makespan,
        served_max=int(served.max()), served_min=int(served.min()),
        served_cv=float(served.std() / served.mean()) if served.mean() else math.nan,
        prefill_tokens=sum(w.prefilled for w in run.workers),
        busy_mean=float(np.mean([w.busy_s for w in run.workers]) / makespan) if makespan else 0.0,
        ttft_pred_err_p50_s=float(np.median(err)) if len(reqs) else math.nan,
        resyncs=run.resyncs, retractions=sum(w.retractions for w in run.workers),
        wall_s=run.wall_s, route_ms_mean=1e3 * run.route_s / len(reqs) if reqs else math.nan,
    )


def describe(trace: Trace, model: ServiceModel) -> str:
    """What was simulated, in a few lines (printed above the table)."""
    cfg, n = trace.config, len(trace)
    prompt = sum(trace.prompt_len(i) for i in range(n))
    perfect = 1 - trace.min_prefill_tokens() / prompt if prompt else 0.0
    return "\n".join((
        f"{cfg.workers} workers, {n} requests over {cfg.num_docs} documents "
        f"({cfg.doc_tokens[0]}-{cfg.doc_tokens[1]} tokens, Zipf {cfg.zipf}) + "
        f"{cfg.question_tokens[0]}-{cfg.question_tokens[1]}-token questions"
        + (f" + a {cfg.system_tokens}-token system prefix" if cfg.system_tokens else "")
        + f", {cfg.output_tokens} output tokens, seed {cfg.seed}",
        f"arrivals: Poisson {trace.rate:.1f} req/s"
        + ("" if cfg.rate else f" = {cfg.utilisation:.0%} of the cluster's capacity under perfect "
           "caching (each document prefilled once in the cluster; decode at large batch, "
           "fixed step cost amortised away)"),
        f"best possible hit rate {perfect:.1%}; worker: prefill {model.prefill_tps:g} tok/s, "
        f"step {model.decode_base_s:g} s + {model.decode_per_seq_s:g} s/decode + "
        f"prefill tokens/rate, chunk {model.chunk_tokens}, {model.kv_slots} KV slots, "
        f"page {model.page_size}"
        + (f", host tier {model.host_slots} KV slots at {model.host_load_tps:g} tok/s"
           if model.host_slots else ""),
    ))


COLUMNS = ("policy", "hit rate", "TTFT p50 (s)", "TTFT p90 (s)", "TTFT p99 (s)",
           "mean e2e (s)", "req/s", "served max/min", "served CV", "prefill Mtok", "busy",
           "retractions")
TIMING = ("sim wall (s)", "route (ms)")


def markdown(rows: list[Summary], timings: bool = True) -> str:
    """One row per policy; ``timings`` adds the (machine-dependent) wall times."""
    cols = COLUMNS + (TIMING if timings else ())
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for s in rows:
        spread = f"{s.spread:.1f}x" if math.isfinite(s.spread) else "inf"
        cells = [s.policy, f"{s.hit_rate:.1%}", f"{s.ttft_p50_s:.2f}", f"{s.ttft_p90_s:.2f}",
                 f"{s.ttft_p99_s:.2f}", f"{s.e2e_mean_s:.2f}", f"{s.throughput_rps:.1f}",
                 f"{s.served_max}/{s.served_min} ({spread})", f"{s.served_cv:.2f}",
                 f"{s.prefill_tokens / 1e6:.2f}", f"{s.busy_mean:.0%}", str(s.retractions)]
        if timings:
            cells += [f"{s.wall_s:.1f}", f"{s.route_ms_mean:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_json(path: Path, setup: dict, rows: list[Summary]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"setup": setup, "results": [asdict(s) | {"spread": s.spread} for s in rows]}
    path.write_text(json.dumps(data, indent=2, default=_plain) + "\n")


def _plain(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
