"""What one worker's core reports: the load report the router reads and the counters
(SchedStats) tests, /metrics and tooling read."""

from __future__ import annotations

from typing import Any

from libs.protocol.messages import LoadReport, SchedStats

from .reports import StepRates

SchedulerCore = Any  # NOTE: core.py's SchedulerCore, which imports this module


def waiting(core: SchedulerCore) -> int:
    """Requests not running yet: queued, waiting for their KV from a prefill worker or
    for their pages from the shared store."""
    return len(core.waiting) + len(core.decode) + (core.store.num_waiting if core.store else 0)


def load_report(core: SchedulerCore, rates: StepRates, scheduler_id: str, ts: float,
                alive: bool, session: str) -> LoadReport:
    info = core.info
    return LoadReport(
        worker_id=info.worker_id, scheduler_id=scheduler_id, model=info.model,
        running=len(core.running), waiting=waiting(core),
        free_slots=core.cache.available, total_slots=info.kv_slots,
        max_model_len=info.max_model_len, ts=ts,
        queued_prefill_tokens=core.queued_prefill_tokens(), prefill_tps=rates.prefill_tps,
        decode_step_s=rates.decode_step_s, alive=alive, session=session,
        host_load_tps=rates.host_load_tps, role=info.role, kv_layout=info.kv_layout,
        store_prefix=core.store.keys.prefix if core.store else "",
        store_load_tps=core.store.fetch_tps if core.store else 0.0, decode_row_s=rates.decode_row_s,
        remote_prefill_min_tokens=core.config.remote_prefill_min_tokens,
        transfer_tps=core.decode.rates.tokens_per_s(),
    )


def sched_stats(core: SchedulerCore) -> SchedStats:
    size = core.cache.tree.size_info() if core.cache.tree else (0, 0)
    p, d = core.planner, core.decode
    return SchedStats(
        worker_id=core.info.worker_id, steps=core.steps, running=len(core.running),
        waiting=waiting(core), free_slots=core.cache.free,
        max_batch_size=max(core.batch_sizes, default=0),
        batch_size_hist=dict(core.batch_sizes), tokens_generated=core.generated,
        requests_finished=core.finished, prompt_tokens=p.prompt_tokens,
        cached_tokens=p.cached_tokens, retractions=p.retractions,
        cache_enabled=core.cache.tree is not None,
        evictable_slots=size[0], protected_slots=size[1], **_host(core), **_store(core),
        kv_transfers_in=d.received, kv_transfers_out=core.prefill.sent,
        kv_transfer_bytes=d.nbytes, kv_transfer_seconds=d.seconds,
        kv_transfer_failures=dict(d.failures),
        kv_transfer_renewals=d.renewals,
    )


def _host(core: SchedulerCore) -> dict[str, int]:
    h = core.host
    if h is None:
        return {}
    return dict(host_slots=core.info.host_kv_slots, host_free_slots=h.num_free,
                host_demoted_tokens=h.demoted, host_loaded_tokens=h.loaded, store_put_tokens=h.put)


def _store(core: SchedulerCore) -> dict:
    s = core.store
    if s is None:
        return {}
    return dict(store_fetches=dict(s.outcomes), store_fetched_tokens=s.fetched_tokens)
