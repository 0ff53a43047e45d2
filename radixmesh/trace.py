"""Spans kept locally, and ``radixmesh trace``: a request's span tree in the terminal.

Without Jaeger, ``radixmesh up`` runs a :class:`SpanReceiver` (OTLP over HTTP,
protobuf) and points every service's exporter at it; each span becomes one JSON
line in ``<log dir>/spans.jsonl``. ``radixmesh trace <request-id|trace-id|last>``
prints that request's spans as a waterfall::

    offset ms  duration ms  service      span
          0.0       812.4   gateway      POST /v1/chat/completions  |##########|
          0.4       810.9   gateway        gateway.request          |##########|
          ...
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterable

SPANS_FILE = "spans.jsonl"
_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


# -- receiving --------------------------------------------------------------------


def _value(v: Any) -> Any:
    """An OTLP AnyValue as plain JSON."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def _attrs(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def decode_request(body: bytes) -> list[dict]:
    """Flatten one OTLP ExportTraceServiceRequest into span records."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(body)
    out = []
    for rs in request.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append({
                    "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                    "parent_id": s.parent_span_id.hex(), "name": s.name,
                    "service": str(resource.get("service.name", "")),
                    "instance": str(resource.get("service.instance.id", "")),
                    "kind": _KINDS.get(s.kind, str(s.kind)),
                    "start_ns": s.start_time_unix_nano, "end_ns": s.end_time_unix_nano,
                    "status": {0: "unset", 1: "ok", 2: "error"}.get(s.status.code, "unset"),
                    "attributes": _attrs(s.attributes),
                    "events": [{"name": e.name, "time_ns": e.time_unix_nano, "attributes": _attrs(e.attributes)}
                               for e in s.events],
                })
    return out


class SpanReceiver:
    """An OTLP/HTTP trace receiver (``POST /v1/traces``) that appends spans as JSON
    lines to ``path`` (rotated to ``path.1`` past ``max_bytes``) and keeps the last
    ``keep`` in memory (``spans``)."""

    def __init__(self, path: Path | None, host: str = "127.0.0.1", port: int = 0,
                 max_bytes: int = 64 << 20, keep: int = 100_000) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer((host, port), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="span-receiver",
                                       daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "SpanReceiver":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "SpanReceiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.spans)

    def add(self, spans: list[dict]) -> None:
        with self.lock:
            self.spans.extend(spans)
            del self.spans[: max(0, len(self.spans) - self.keep)]
            if self.path is not None:
                self._append(spans)

    def _append(self, spans: list[dict]) -> None:
        if self.path.exists() and self.path.stat().st_size > self.max_bytes:
            self.path.replace(self.path.with_name(self.path.name + ".1"))
        with self.path.open("a") as f:
            f.write("".join(json.dumps(s, separators=(",", ":")) + "\n" for s in spans))


def _handler(receiver: SpanReceiver) -> type[BaseHTTPRequestHandler]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    ok = ExportTraceServiceResponse().SerializeToString()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's API
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path.rstrip("/") != "/v1/traces":
                self._reply(404, b"")
                return
            try:
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.add(decode_request(body))
            except Exception as exc:  # noqa: BLE001 - a bad export is the sender's problem
                self._reply(400, str(exc).encode(), "text/plain")
                return
            self._reply(200, ok)

        def _reply(self, status: int, body: bytes, ctype: str = "application/x-protobuf") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    return Handler


# -- finding a trace --------------------------------------------------------------


def load_spans(log_dir: Path) -> list[dict]:
    """Every span kept in ``log_dir`` (the rotated file first)."""
    spans = []
    for path in (log_dir / (SPANS_FILE + ".1"), log_dir / SPANS_FILE):
        if path.exists():
            with path.open() as f:
                spans.extend(json.loads(line) for line in f if line.strip())
    return spans


def find_trace(spans: list[dict], key: str) -> list[dict]:
    """The spans of one trace: ``key`` is a trace id, a request id (``chatcmpl-``
    / ``cmpl-`` prefixes allowed) or ``last`` (the latest request)."""
    if key == "last":
        requests = [s for s in spans if s["name"] == "gateway.request"]
        if not requests:
            return []
        trace_id = max(requests, key=lambda s: s["start_ns"])["trace_id"]
    elif len(key) == 32 and any(s["trace_id"] == key for s in spans):
        trace_id = key
    else:
        rid = key.removeprefix("chatcmpl-").removeprefix("cmpl-")
        hits = [s for s in spans if s["attributes"].get("radixmesh.rid") == rid]
        if not hits:
            return []
        trace_id = hits[0]["trace_id"]
    return [s for s in spans if s["trace_id"] == trace_id]


# -- the waterfall ----------------------------------------------------------------


@dataclass
class Node:
    span: dict
    depth: int = 0
    children: list["Node"] = field(default_factory=list)


def span_tree(spans: list[dict]) -> list[Node]:
    """Depth-first, children by start time; a span whose parent is missing is a root."""
    nodes = {s["span_id"]: Node(s) for s in spans}
    roots = []
    for node in nodes.values():
        parent = nodes.get(node.span["parent_id"])
        (parent.children if parent is not None else roots).append(node)
    out: list[Node] = []

    def walk(node: Node, depth: int) -> None:
        node.depth = depth
        out.append(node)
        for child in sorted(node.children, key=lambda n: n.span["start_ns"]):
            walk(child, depth + 1)

    for root in sorted(roots, key=lambda n: n.span["start_ns"]):
        walk(root, 0)
    return out


def render(spans: list[dict], width: int = 40) -> str:
    """The waterfall: offset, duration, service and indented name, then a time bar."""
    if not spans:
        return "no spans"
    t0 = min(s["start_ns"] for s in spans)
    total = max(max(s["end_ns"] for s in spans) - t0, 1)
    nodes = span_tree(spans)
    rid = next((s["attributes"]["radixmesh.rid"] for s in spans
                if s["name"] == "gateway.request" and "radixmesh.rid" in s["attributes"]), "?")
    services = {_service(s) for s in spans}
    lines = [f"trace {spans[0]['trace_id']}  request {rid}  {total / 1e6:.1f} ms  "
             f"{len(spans)} spans  {len(services)} services",
             f"{'offset ms':>10} {'duration ms':>12}  {'service':<12} span"]
    names = [("  " * n.depth + n.span["name"]) for n in nodes]
    name_w = min(max(len(n) for n in names), 64)
    for node, name in zip(nodes, names):
        s = node.span
        start, end = (s["start_ns"] - t0) / total, (s["end_ns"] - t0) / total
        a = min(int(start * width), width - 1)
        b = max(a + 1, min(int(round(end * width)), width))
        bar = " " * a + "#" * (b - a) + " " * (width - b)
        flag = " !" if s.get("status") == "error" else ""
        lines.append(f"{(s['start_ns'] - t0) / 1e6:>10.1f} {(s['end_ns'] - s['start_ns']) / 1e6:>12.1f}  "
                     f"{_service(s):<12} {name[:name_w]:<{name_w}} |{bar}|{flag}")
    return "\n".join(lines)


def _service(span: dict) -> str:
    return span["service"].removeprefix("radixmesh-")


# -- the command ------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("request", help="request id (x-request-id), trace id (x-trace-id) or 'last'")
    parser.add_argument("--log-dir", default="logs", help="the stack's log dir (where spans.jsonl is)")
    parser.add_argument("--width", type=int, default=40, help="width of the time bars")
    parser.add_argument("--json", action="store_true", help="print the trace's spans as JSON lines")


def export_delay(log_dir: Path) -> float:
    """How long spans of a request that just ended may still be on their way to
    ``log_dir``: the running stack's export delay plus a margin (0: no stack runs)."""
    try:
        state = json.loads((log_dir / "stack.json").read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0
    return float(state.get("span_export_delay_s", 0.5)) + 0.5 if state.get("spans") else 0.0


def newest_spans(log_dir: Path, key: str, clock=time.monotonic, sleep=time.sleep) -> list[dict]:
    """The spans kept in ``log_dir`` once those of a request that just ended are in.

    NOTE: services export spans in batches every ``OTEL_BSP_SCHEDULE_DELAY``, so
    right after a request its spans are not in the file yet: ``last`` waits out the
    delay, a request id is polled for until then."""
    delay = export_delay(log_dir)
    if key == "last":
        sleep(delay)
        return load_spans(log_dir)
    deadline = clock() + delay
    spans = load_spans(log_dir)
    while not find_trace(spans, key) and clock() < deadline:
        sleep(0.2)
        spans = load_spans(log_dir)
    return spans


def run(args: argparse.Namespace) -> int:
    log_dir = Path(args.log_dir)
    spans = newest_spans(log_dir, args.request)
    if not spans:
        print(f"radixmesh: no spans in {log_dir / SPANS_FILE}: start the stack with `radixmesh up` "
              "(it keeps spans unless --no-traces), or read traces in Jaeger when OTEL_* points there")
        return 1
    found = find_trace(spans, args.request)
    if not found:
        print(f"radixmesh: no trace for {args.request!r} among {len(spans)} spans in {log_dir}")
        return 1
    if args.json:
        print("\n".join(json.dumps(s) for s in sorted(found, key=lambda s: s["start_ns"])))
    else:
        print(render(found, args.width))
    return 0
