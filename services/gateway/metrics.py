"""The gateway's Prometheus ``/metrics``: the requests it serves and the cluster it sees.

Request metrics are measured here, once per request, under SGLang's names
(``sglang:time_to_first_token_seconds``, ...), so SGLang dashboards work as they are.
Cluster gauges carry a ``worker`` label: running / queued requests and KV usage
come from the LoadReports the gateway already receives (every 0.5 s); cache hit
rate, generation throughput and the worker's idle fraction come from each
scheduler's SchedStats, asked over the bus when ``/metrics`` is scraped. So one
scrape target shows the whole cluster. (With several gateways every one reports
the same cluster gauges: aggregate them with ``max by (worker)``.)
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.messages import SchedStats, SchedStatsRequest

from .fallback import LoadView
from .generation import Generation
from .usage import cached_by_tier

__all__ = ["ClusterView", "MetricsPage", "RequestMetrics"]

log = logging.getLogger("radixmesh.gateway.metrics")

# SGLang's buckets (python/sglang/srt/metrics/collector.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 15.0, 20.0, 25.0, 30.0)
TPOT_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


class RequestMetrics:
    """Per-request latencies and token counts, observed by the pipeline."""

    def __init__(self, model_name: str, registry: CollectorRegistry) -> None:
        m, r = ["model_name"], registry
        self.model_name = model_name
        self.ttft = Histogram("sglang:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", m,
                              buckets=TTFT_BUCKETS, registry=r).labels(model_name)
        self.tpot = Histogram("sglang:time_per_output_token_seconds",
                              "Histogram of time per output token in seconds.", m,
                              buckets=TPOT_BUCKETS, registry=r).labels(model_name)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds",
                             "Histogram of End-to-end request latency in seconds", m,
                             buckets=E2E_BUCKETS, registry=r).labels(model_name)
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.",
                                     m, registry=r).labels(model_name)
        self.generation_tokens = Counter("sglang:generation_tokens",
                                         "Number of generation tokens processed.", m,
                                         registry=r).labels(model_name)
        self.cached_tokens = Counter("sglang:cached_tokens", "Number of cached prompt tokens.",
                                     m, registry=r).labels(model_name)
        self.cached_by_tier = Counter("radixmesh:cached_tokens_by_tier",
                                      "Cached prompt tokens by where they came from: device, host "
                                      "(loaded back) or store (fetched from the shared store)",
                                      [*m, "tier"], registry=r)
        self.requests = Counter("sglang:num_requests", "Number of requests processed.", m,
                                registry=r).labels(model_name)
        self.errors = Counter("radixmesh:request_errors", "Requests that failed, by error code.",
                              ["code"], registry=r)
        self.routes = Counter("radixmesh:routing_decisions",
                              "Requests routed, by routing policy and chosen worker.",
                              ["policy", "worker"], registry=r)

        self.ttft_predicted = Histogram(
            "radixmesh:ttft_predicted_seconds",
            "The router's predicted time to first token of the chosen worker.", ["policy"],
            buckets=TTFT_BUCKETS, registry=r)
        self.ttft_prediction_error = Histogram(
            "radixmesh:ttft_prediction_error_seconds",
            "|measured - predicted| time to first token, per routing policy.", ["policy"],
            buckets=TTFT_BUCKETS, registry=r)

    def routed(self, policy: str, worker: str) -> None:
        self.routes.labels(policy, worker).inc()

    def failed(self, code: str) -> None:
        self.errors.labels(code).inc()

    def first_token(self, gen: Generation) -> None:
        ttft = gen.first_token_at - gen.started
        self.ttft.observe(ttft)
        if gen.predicted_ttft is not None:
            policy, predicted = gen.predicted_ttft
            self.ttft_predicted.labels(policy).observe(predicted)
            self.ttft_prediction_error.labels(policy).observe(abs(ttft - predicted))

    def finished(self, gen: Generation) -> None:
        """A generation closed: its latency (if it produced output) and its tokens."""
        now = time.perf_counter()
        usage = gen.final_usage()
        self.requests.inc()
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.generation_tokens.inc(usage.completion_tokens)
        self.cached_tokens.inc(usage.cached_tokens)
        for tier, tokens in cached_by_tier(usage).items():
            self.cached_by_tier.labels(self.model_name, tier).inc(tokens)
        if gen.error is not None:
            self.failed(gen.error.code)
        if gen.first_token_at is None:
            return
        self.e2e.observe(now - gen.started)
        if usage.completion_tokens > 1:
            self.tpot.observe((now - gen.first_token_at) / (usage.completion_tokens - 1))


class ClusterView:
    """Per-worker gauges, refreshed from load reports and SchedStats at scrape time."""

    def __init__(self, bus: Bus, subjects: Subjects, loads: LoadView, model_name: str,
                 registry: CollectorRegistry, worker_model: str | None = None,
                 timeout: float = 1.0) -> None:
        self.bus, self.subjects, self.loads = bus, subjects, loads
        self.model_name = model_name  # the label: the name clients use
        self.worker_model = worker_model  # workers announcing another model are not ours
        self.timeout = timeout
        labels, r = ["model_name", "worker"], registry
        self.running = Gauge("sglang:num_running_reqs", "The number of running requests", labels, registry=r)
        self.queued = Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue",
                            labels, registry=r)
        self.token_usage = Gauge("sglang:token_usage", "The token usage (share of KV slots in use)",
                                 labels, registry=r)
        self.hit_rate = Gauge("sglang:cache_hit_rate",
                              "The cache hit rate (cached / prompt tokens since the scheduler started)",
                              labels, registry=r)
        self.throughput = Gauge("sglang:gen_throughput",
                                "The generate throughput (token/s) since the previous scrape",
                                labels, registry=r)
        self.idle = Gauge("radixmesh:worker_idle_fraction",
                          "Share of the time the worker waited for its next step while work was queued",
                          labels, registry=r)
        self.active_s = Gauge("radixmesh:worker_active_seconds",
                              "Seconds the worker had steps queued or running (since adoption)",
                              labels, registry=r)
        self.busy_s = Gauge("radixmesh:worker_busy_seconds",
                            "Seconds of model forward time within the active time", labels, registry=r)
        self.host_usage = Gauge("radixmesh:host_kv_usage",
                                "Share of the worker's host KV pool (the host tier) in use",
                                labels, registry=r)
        self.host_loaded = Gauge("radixmesh:host_loaded_tokens",
                                 "Prompt tokens loaded back from the host tier instead of recomputed "
                                 "(since the scheduler started)", labels, registry=r)
        self.host_demoted = Gauge("radixmesh:host_demoted_tokens",
                                  "Tokens of KV copied down to the host tier on eviction "
                                  "(since the scheduler started)", labels, registry=r)
        self.transfers = Gauge("radixmesh:kv_transfers",
                               "Prefill/decode KV transfers: received (decode side) or sent (prefill "
                               "side) since the scheduler started", [*labels, "direction"], registry=r)
        self.transfer_bytes = Gauge("radixmesh:kv_transfer_bytes",
                                    "Bytes of KV a decode worker received from prefill workers",
                                    labels, registry=r)
        self.transfer_s = Gauge("radixmesh:kv_transfer_seconds",
                                "Seconds from asking a prefill worker to its KV staged here, summed",
                                labels, registry=r)
        self.transfer_failures = Gauge("radixmesh:kv_transfer_failures",
                                       "Transfers given up (the decode worker prefilled itself), by reason",
                                       [*labels, "reason"], registry=r)
        self.store_fetches = Gauge("radixmesh:store_fetches",
                                   "Shared-store (L3) prefetches by outcome: complete, partial, deadline, "
                                   "miss, error, skipped (predicted slower than recomputing), no_room, "
                                   "joined (waited for another request's fetch of the same pages)",
                                   [*labels, "outcome"], registry=r)
        self.store_tokens = Gauge("radixmesh:store_tokens",
                                  "Tokens of KV fetched from / put to the shared store (L3)",
                                  [*labels, "direction"], registry=r)
        self.unreachable = Gauge("radixmesh:worker_stats_unavailable",
                             "1 when the worker's scheduler did not answer the stats request", labels,
                             registry=r)
        self._last: dict[str, tuple[int, float]] = {}  # worker -> (tokens generated, when)

    async def refresh(self) -> None:
        reports = [r for r in self.loads.live()
                   if self.worker_model is None or r.model == self.worker_model]
        for gauge in (self.running, self.queued, self.token_usage, self.hit_rate, self.throughput,
                      self.idle, self.active_s, self.busy_s, self.unreachable, self.host_usage,
                      self.host_loaded, self.host_demoted, self.transfers, self.transfer_bytes,
                      self.transfer_s, self.transfer_failures, self.store_fetches, self.store_tokens):
            gauge.clear()  # NOTE: workers that left disappear from the scrape
        for r in reports:
            key = (self.model_name, r.worker_id)
            self.running.labels(*key).set(r.running)
            self.queued.labels(*key).set(r.waiting)
            self.token_usage.labels(*key).set(1.0 - r.free_slots / r.total_slots if r.total_slots else 0.0)
        stats = await asyncio.gather(*(
            self.bus.request(self.subjects.sched_stats(r.worker_id), SchedStatsRequest(),
                             SchedStats, self.timeout) for r in reports
        ), return_exceptions=True)
        now = time.monotonic()
        for r, st in zip(reports, stats):
            key = (self.model_name, r.worker_id)
            if isinstance(st, BaseException):
                if not isinstance(st, ServiceError):
                    log.warning("stats of %s failed: %r", r.worker_id, st)
                self.unreachable.labels(*key).set(1)
                continue
            self.unreachable.labels(*key).set(0)
            self.hit_rate.labels(*key).set(st.cached_tokens / st.prompt_tokens if st.prompt_tokens else 0.0)
            self.idle.labels(*key).set(st.worker_idle_fraction)
            self.active_s.labels(*key).set(st.worker_active_s)
            self.busy_s.labels(*key).set(st.worker_busy_s)
            if st.host_slots:
                self.host_usage.labels(*key).set(1.0 - st.host_free_slots / st.host_slots)
                self.host_loaded.labels(*key).set(st.host_loaded_tokens)
                self.host_demoted.labels(*key).set(st.host_demoted_tokens)
            self._transfers(key, st)
            self._store(key, st)
            last = self._last.get(r.worker_id)
            rate = 0.0
            if last is not None and now > last[1] and st.tokens_generated >= last[0]:
                rate = (st.tokens_generated - last[0]) / (now - last[1])
            self.throughput.labels(*key).set(rate)
            self._last[r.worker_id] = (st.tokens_generated, now)
        for gone in set(self._last) - {r.worker_id for r in reports}:
            del self._last[gone]


    def _store(self, key: tuple[str, str], st: SchedStats) -> None:
        for outcome, n in st.store_fetches.items():
            self.store_fetches.labels(*key, outcome).set(n)
        if st.store_fetches or st.store_put_tokens:
            self.store_tokens.labels(*key, "fetched").set(st.store_fetched_tokens)
            self.store_tokens.labels(*key, "put").set(st.store_put_tokens)

    def _transfers(self, key: tuple[str, str], st: SchedStats) -> None:
        if not (st.kv_transfers_in or st.kv_transfers_out or st.kv_transfer_failures):
            return
        self.transfers.labels(*key, "in").set(st.kv_transfers_in)
        self.transfers.labels(*key, "out").set(st.kv_transfers_out)
        self.transfer_bytes.labels(*key).set(st.kv_transfer_bytes)
        self.transfer_s.labels(*key).set(st.kv_transfer_seconds)
        for reason, n in st.kv_transfer_failures.items():
            self.transfer_failures.labels(*key, reason).set(n)


class MetricsPage:
    """``GET /metrics``: the gateway's registry plus this process's default one."""

    def __init__(self, registry: CollectorRegistry, cluster: ClusterView | None = None) -> None:
        self.registry = registry
        self.cluster = cluster
        self._lock = asyncio.Lock()  # NOTE: a refresh clears the cluster gauges first

    async def __call__(self) -> bytes:
        async with self._lock:
            if self.cluster is not None:
                await self.cluster.refresh()
            return generate_latest(self.registry) + generate_latest(REGISTRY)
