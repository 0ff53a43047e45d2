"""radixmesh.trace: the OTLP/HTTP span receiver, finding a request's trace, the waterfall."""

from __future__ import annotations

import json

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from radixmesh import cli
from radixmesh.trace import SPANS_FILE, SpanReceiver, find_trace, load_spans, render, span_tree


def export_request(endpoint: str, service: str, rid: str, compression: bool = False) -> str:
    """Export a small request trace through the real OTLP/HTTP exporter; returns its id."""
    from opentelemetry.exporter.otlp.proto.http import Compression

    exporter = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces",
                                compression=Compression.Gzip if compression else None)
    provider = TracerProvider(resource=Resource({"service.name": f"radixmesh-{service}"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("POST /v1/chat/completions", kind=trace.SpanKind.SERVER) as root:
        with tracer.start_as_current_span("gateway.request", attributes={"radixmesh.rid": rid}):
            with tracer.start_as_current_span("cache_index.route", attributes={
                    "radixmesh.route.score": [0.25, 0.5], "radixmesh.route.candidates": ["a", "b"]}) as s:
                s.add_event("picked", {"worker": "a"})
    provider.shutdown()
    return f"{root.get_span_context().trace_id:032x}"


def test_receiver_decodes_otlp_exports_into_jsonl(tmp_path):
    with SpanReceiver(tmp_path / SPANS_FILE) as receiver:
        first = export_request(receiver.endpoint, "gateway", "r1")
        second = export_request(receiver.endpoint, "gateway", "r2", compression=True)
    spans = load_spans(tmp_path)
    assert len(spans) == 6 and receiver.snapshot() == spans
    found = find_trace(spans, "r1")
    assert {s["trace_id"] for s in found} == {first}
    route = next(s for s in found if s["name"] == "cache_index.route")
    assert route["attributes"]["radixmesh.route.score"] == [0.25, 0.5]
    assert route["events"][0]["attributes"] == {"worker": "a"}
    assert route["service"] == "radixmesh-gateway" and route["end_ns"] >= route["start_ns"]
    root = next(s for s in found if not s["parent_id"])
    assert root["kind"] == "server"
    assert {s["trace_id"] for s in find_trace(spans, "last")} == {second}
    assert find_trace(spans, first) == found
    assert find_trace(spans, "chatcmpl-r2") == find_trace(spans, "r2") != []
    assert find_trace(spans, "unknown") == []


def test_receiver_rotates_its_file(tmp_path):
    with SpanReceiver(tmp_path / SPANS_FILE, max_bytes=1) as receiver:
        export_request(receiver.endpoint, "gateway", "r1")
        export_request(receiver.endpoint, "gateway", "r2")
    assert (tmp_path / (SPANS_FILE + ".1")).exists()
    assert {s["attributes"].get("radixmesh.rid") for s in load_spans(tmp_path)} >= {"r2"}


def span(sid: str, parent: str, name: str, start: int, end: int, service: str = "radixmesh-gateway",
         **attrs) -> dict:
    return {"trace_id": "t" * 32, "span_id": sid, "parent_id": parent, "name": name,
            "service": service, "start_ns": start, "end_ns": end, "attributes": attrs,
            "status": "unset", "events": [], "kind": "internal"}


def test_waterfall_is_a_depth_first_tree_with_offsets():
    spans = [
        span("c", "b", "send encode", 2_000_000, 5_000_000),
        span("a", "", "POST /generate", 0, 100_000_000),
        span("b", "a", "gateway.request", 1_000_000, 99_000_000, **{"radixmesh.rid": "r9"}),
        span("d", "b", "scheduler.queue", 10_000_000, 60_000_000, service="radixmesh-scheduler"),
        span("e", "zz", "orphan", 50_000_000, 51_000_000),
    ]
    assert [n.span["span_id"] for n in span_tree(spans)] == ["a", "b", "c", "d", "e"]
    assert [n.depth for n in span_tree(spans)] == [0, 1, 2, 2, 0]
    lines = render(spans, width=10).splitlines()
    assert lines[0].startswith("trace " + "t" * 32 + "  request r9  100.0 ms  5 spans  2 services")
    queue = next(line for line in lines if "scheduler.queue" in line)
    assert queue.split()[:3] == ["10.0", "50.0", "scheduler"]
    assert queue.endswith("|" + " " * 1 + "#" * 5 + " " * 4 + "|")


def test_trace_command_without_spans(tmp_path, capsys):
    assert cli.main(["trace", "last", "--log-dir", str(tmp_path)]) == 1
    assert "no spans" in capsys.readouterr().out
    (tmp_path / SPANS_FILE).write_text(json.dumps(span("a", "", "x", 0, 1)) + "\n")
    assert cli.main(["trace", "last", "--log-dir", str(tmp_path)]) == 1
    assert "no trace for 'last'" in capsys.readouterr().out
