"""The real stack exporting to a real OTLP/HTTP receiver (the launcher's, decoding
opentelemetry-proto): one request is one trace across all five services, the queue
wait is its own span, routing carries its candidates; /metrics counts requests."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixmesh import cli
from radixmesh.launcher import LocalStack, ephemeral_stack_config
from radixmesh.natsd import free_port
from radixmesh.trace import find_trace

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
SERVICES = {"gateway", "tokenizer", "cache_index", "scheduler", "gpu_worker"}
DASHBOARD = Path(__file__).resolve().parents[2] / "observability" / "grafana" / "dashboard.json"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    index_metrics, worker_metrics = free_port(), free_port()
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("OTEL_")]:
            mp.delenv(key)
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        config = ephemeral_stack_config(
            tmp_path_factory.mktemp("obs-logs"), traces=True,
            extra={"scheduler": ["--max-running-requests", "1"],
                   "cache_index": ["--metrics-port", str(index_metrics), "--metrics-host", "127.0.0.1"],
                   "gpu_worker": ["--metrics-port", str(worker_metrics), "--metrics-host", "127.0.0.1"]},
        )
        with LocalStack(config, progress=lambda msg: None) as running:
            running.index_metrics = f"http://127.0.0.1:{index_metrics}/metrics"
            running.worker_metrics = f"http://127.0.0.1:{worker_metrics}/metrics"
            yield running


@pytest.fixture
async def client(stack):
    async with httpx.AsyncClient(base_url=stack.url, timeout=120) as c:
        yield c


def chat(text: str, max_tokens: int = 8, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "temperature": 0, **extra}


async def trace_spans(stack: LocalStack, trace_id: str, done, timeout: float = 15.0) -> list[dict]:
    """The trace's spans once ``done(spans)`` holds (spans arrive in export batches)."""
    deadline = time.monotonic() + timeout
    while True:
        spans = [s for s in stack.spans.snapshot() if s["trace_id"] == trace_id]
        if done(spans):
            await asyncio.sleep(0.3)  # stragglers of the same trace
            return [s for s in stack.spans.snapshot() if s["trace_id"] == trace_id]
        assert time.monotonic() < deadline, sorted((s["service"], s["name"]) for s in spans)
        await asyncio.sleep(0.1)


def named(spans: list[dict], name: str) -> list[dict]:
    return [s for s in spans if s["name"] == name]


def service(span: dict) -> str:
    return span["service"].removeprefix("radixmesh-")


async def test_one_request_is_one_trace_across_every_service(stack, client):
    before = {s["trace_id"] for s in stack.spans.snapshot()}
    resp = await client.post("/v1/chat/completions", json=chat("Name a color."))
    assert resp.status_code == 200
    rid, trace_id = resp.headers["x-request-id"], resp.headers["x-trace-id"]
    assert resp.json()["id"] == f"chatcmpl-{rid}" and len(trace_id) == 32

    spans = await trace_spans(stack, trace_id, lambda spans: {service(s) for s in spans} == SERVICES
                              and named(spans, "POST /v1/chat/completions")
                              and named(spans, "scheduler.request")
                              and named(spans, "tokenizer.detokenize"))
    assert {service(s) for s in spans} == SERVICES
    # exactly one trace: no other trace appeared and every span naming the request is in it
    assert {s["trace_id"] for s in stack.spans.snapshot()} - before == {trace_id}
    assert {s["trace_id"] for s in stack.spans.snapshot()
            if s["attributes"].get("radixmesh.rid") == rid} == {trace_id}
    ids = {s["span_id"] for s in spans}
    roots = [s for s in spans if not s["parent_id"]]
    assert [r["name"] for r in roots] == ["POST /v1/chat/completions"]
    assert all(s["parent_id"] in ids for s in spans if s not in roots)

    (request,) = named(spans, "gateway.request")
    assert request["attributes"]["radixmesh.model"] == MODEL
    usage = resp.json()["usage"]
    assert request["attributes"]["radixmesh.prompt_tokens"] == usage["prompt_tokens"]
    assert request["attributes"]["radixmesh.completion_tokens"] == usage["completion_tokens"]
    (route,) = named(spans, "cache_index.route")
    attrs = route["attributes"]
    assert attrs["radixmesh.route.policy"] == "cache_aware"
    assert attrs["radixmesh.route.candidates"] == [attrs["radixmesh.route.worker"]]
    assert len(attrs["radixmesh.route.score"]) == 1 and attrs["radixmesh.route.score"][0] > 0
    assert attrs["radixmesh.route.cached_tokens"] == [0] and attrs["radixmesh.route.load"] == [0]
    for name in ("tokenizer.encode", "scheduler.queue", "scheduler.prefill", "gpu_worker.forward",
                 "gateway.stream"):
        assert len(named(spans, name)) == 1, name
    (decode,) = named(spans, "scheduler.decode")
    assert decode["events"][0]["name"] == "first_token"


A_TOKENS = 160


async def test_queue_wait_span_covers_the_measured_wait(stack, client):
    """With one running request at a time, B waits in the queue while A decodes (160
    tokens: over a second even on a fast machine)."""
    first_token = asyncio.Event()
    a_end = 0.0

    async def run_a() -> None:
        nonlocal a_end
        body = {"model": MODEL, "prompt": "Count: one, two,", "max_tokens": A_TOKENS, "temperature": 0,
                "ignore_eos": True, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    first_token.set()
        a_end = time.perf_counter()

    task = asyncio.create_task(run_a())
    await asyncio.wait_for(first_token.wait(), 60)
    b_sent = time.perf_counter()
    resp = await client.post("/v1/chat/completions", json=chat("Say hi.", max_tokens=2))
    await task
    assert resp.status_code == 200
    waited = a_end - b_sent
    assert waited > 1.0  # A really held the only running slot

    spans = await trace_spans(stack, resp.headers["x-trace-id"],
                              lambda spans: named(spans, "scheduler.request"))
    (queue,) = named(spans, "scheduler.queue")
    queued = (queue["end_ns"] - queue["start_ns"]) / 1e9
    assert waited - 0.25 <= queued <= waited + 0.25, (queued, waited)
    a_request = [s for s in stack.spans.snapshot() if s["name"] == "scheduler.request"
                 and s["attributes"].get("radixmesh.completion_tokens") == A_TOKENS]
    assert len(a_request) == 1
    assert queue["start_ns"] < a_request[0]["end_ns"] <= queue["end_ns"]  # admitted when A ended


def scrape(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == val for k, val in labels.items()))


async def test_metrics_count_the_requests(stack, client):
    await asyncio.sleep(0.3)  # earlier requests are closed
    before = scrape((await client.get("/metrics")).text)
    bodies = [chat("Tell me about the sea.", 6), chat("Tell me about the sea.", 6),
              chat("What is two plus two?", 5)]
    replies = [await client.post("/v1/chat/completions", json=b) for b in bodies]
    async with client.stream("POST", "/v1/completions", json={
            "model": MODEL, "prompt": "Once upon a time", "max_tokens": 7, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}) as resp:
        events = [json.loads(line[6:]) async for line in resp.aiter_lines()
                  if line.startswith("data: {")]
    usages = [r.json()["usage"] for r in replies] + [events[-1]["usage"]]
    await asyncio.sleep(0.3)
    page = await client.get("/metrics")
    assert page.status_code == 200 and "x-request-id" in page.headers
    after = scrape(page.text)

    def delta(name: str, **labels) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    n = len(usages)
    for name in ("sglang:time_to_first_token_seconds_count", "sglang:e2e_request_latency_seconds_count",
                 "sglang:time_per_output_token_seconds_count", "sglang:num_requests_total"):
        assert delta(name, model_name=MODEL) == n, name
    assert delta("sglang:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert delta("sglang:generation_tokens_total") == sum(u["completion_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached > 0 and delta("sglang:cached_tokens_total") == cached
    assert delta("radixmesh:routing_decisions_total", policy="cache_aware") == n
    # every routed request's predicted TTFT is set against the measured one
    assert delta("radixmesh:ttft_predicted_seconds_count", policy="cache_aware") == n
    assert delta("radixmesh:ttft_predicted_seconds_sum", policy="cache_aware") > 0
    assert delta("radixmesh:ttft_prediction_error_seconds_count", policy="cache_aware") == n
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                 "radixmesh:worker_idle_fraction"):
        assert any(k[0] == name for k in after), name
    assert total(after, "sglang:gen_throughput") > 0  # tokens were generated since the last scrape
    assert total(after, "sglang:cache_hit_rate") > 0
    assert total(after, "radixmesh:worker_stats_unavailable") == 0
    # the workers computed for part of the time they had work, never more
    busy, active = delta("radixmesh:worker_busy_seconds"), delta("radixmesh:worker_active_seconds")
    assert 0 < busy <= active

    index = scrape(httpx.get(stack.index_metrics).text)
    assert total(index, "radixmesh:load_report_lag_seconds_count") > 0
    assert total(index, "radixmesh:kv_events_total") > 0
    assert any(k[0].startswith("radixmesh:kv_event_lag_seconds") for k in index)


async def test_trace_command_prints_the_waterfall(stack, client, capsys):
    resp = await client.post("/v1/chat/completions", json=chat("Hello!", 3))
    rid = resp.headers["x-request-id"]
    await trace_spans(stack, resp.headers["x-trace-id"],
                      lambda spans: named(spans, "POST /v1/chat/completions")
                      and named(spans, "tokenizer.detokenize"))
    log_dir = str(stack.config.log_dir)
    assert cli.main(["trace", "last", "--log-dir", log_dir]) == 0
    out = capsys.readouterr().out
    assert f"request {rid}" in out
    for name in SERVICES | {"scheduler.queue", "cache_index.route", "gateway.request"}:
        assert name in out, name
    assert cli.main(["trace", f"chatcmpl-{rid}", "--log-dir", log_dir, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {s["trace_id"] for s in lines} == {resp.headers["x-trace-id"]}
    assert cli.main(["trace", "nope", "--log-dir", log_dir]) == 1


async def test_every_response_carries_the_ids(stack, client):
    bad = await client.post("/v1/chat/completions", json={"model": MODEL})
    assert bad.status_code == 400
    assert bad.headers["x-request-id"] and len(bad.headers["x-trace-id"]) == 32
    health = await client.get("/health")
    assert health.headers["x-request-id"] and "x-trace-id" not in health.headers  # polled: untraced
    (root,) = await trace_spans(stack, bad.headers["x-trace-id"], lambda spans: spans)
    assert root["attributes"]["http.response.status_code"] == 400
    assert find_trace(stack.spans.snapshot(), bad.headers["x-request-id"]) == [root]


async def test_dashboard_queries_only_exposed_metrics(stack, client):
    exposed = set()
    for text in ((await client.get("/metrics")).text, httpx.get(stack.index_metrics).text,
                 httpx.get(stack.worker_metrics).text):
        exposed |= {family.name for family in text_string_to_metric_families(text)}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    used = {re.sub(r"_(bucket|total|count|sum)$", "", name)
            for expr in exprs for name in re.findall(r"(?:sglang|radixmesh):[a-z0-9_]+", expr)}
    assert len(used) >= 15 and used <= exposed, used - exposed
