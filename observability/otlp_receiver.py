"""A minimal OTLP/HTTP trace receiver: a stand-in for Jaeger in tests and smoke runs.

``POST /v1/traces`` takes an ``ExportTraceServiceRequest`` (protobuf, optionally
gzip) and keeps every span; ``GET /spans`` returns them as JSON
(``service``, ``trace_id``, ``span_id``, ``name``, ``kind``), ``GET /health`` says ok.

    python observability/otlp_receiver.py --port 4318

Needs only the standard library and ``opentelemetry-proto`` (a dependency of the
OTLP exporter). Not for production: it keeps spans in memory (capped).
"""

from __future__ import annotations

import argparse
import gzip
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def decode_spans(body: bytes) -> list[dict]:
    """Flatten one ExportTraceServiceRequest into span summaries."""
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        attrs = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append({
                    "service": attrs.get("service.name", ""),
                    "instance": attrs.get("service.instance.id", ""),
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                    "kind": _KINDS.get(span.kind, str(span.kind)),
                })
    return spans


class Receiver:
    """A threaded OTLP/HTTP server on ``host:port`` (port 0: a free one)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, max_spans: int = 100_000) -> None:
        self.spans: list[dict] = []
        self.max_spans = max_spans
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer((host, port), _handler_for(self))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, spans: list[dict]) -> None:
        with self.lock:
            self.spans.extend(spans)
            del self.spans[: max(0, len(self.spans) - self.max_spans)]

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.spans)

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler_for(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            if self.path.rstrip("/") != "/v1/traces":
                return self._send(404, b"not found", "text/plain")
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            try:
                receiver.add(decode_spans(body))
            except Exception as exc:  # noqa: BLE001 - a bad payload is the client's error
                return self._send(400, f"bad OTLP payload: {exc}".encode(), "text/plain")
            self._send(200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                return self._send(200, b'{"status":"ok"}', "application/json")
            if self.path == "/spans":
                return self._send(200, json.dumps(receiver.snapshot()).encode(), "application/json")
            self._send(404, b"not found", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # quiet: one line per export is noise
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=4318)
    args = parser.parse_args()
    receiver = Receiver(args.host, args.port)
    # NOTE: as a container's PID 1 it must handle SIGTERM itself (the default is ignored there)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"OTLP/HTTP receiver on {args.host}:{receiver.port}", flush=True)
    receiver.server.serve_forever()


if __name__ == "__main__":
    main()
