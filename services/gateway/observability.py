"""Per HTTP request: a request id, the root SERVER span, and both in the response headers.

Every response carries ``x-request-id`` (the id in the body: ``chatcmpl-<id>``,
``meta_info.id``) and, when the request is traced, ``x-trace-id`` (32 hex, the
id to search in Jaeger or to pass to ``radixmesh trace``). A caller's W3C
``traceparent`` is honoured, so the request joins the caller's trace. Log lines
written while the request is handled carry both ids.
"""

from __future__ import annotations

import time
import uuid
from contextvars import ContextVar

from opentelemetry import propagate, trace
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from libs.protocol import tracing

# perf_counter() when the HTTP request reached the gateway: TTFT and latencies count from it
request_arrival: ContextVar[float | None] = ContextVar("radixmesh_request_arrival", default=None)

_tracer = trace.get_tracer("radixmesh.gateway")

UNTRACED = frozenset({"/health", "/metrics"})  # polled: ids in headers, no spans


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, routes: frozenset[str] = frozenset(),
                 untraced: frozenset[str] = UNTRACED) -> None:
        self.app = app
        self.routes = routes  # static paths that name the span (others: the method alone)
        self.untraced = untraced

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = uuid.uuid4().hex
        token = tracing.request_id.set(rid)
        arrival = request_arrival.set(time.perf_counter())
        try:
            if scope["path"] in self.untraced:
                await self.app(scope, receive, _with_ids(send, rid, None, []))
            else:
                await self._traced(scope, receive, send, rid)
        finally:
            tracing.request_id.reset(token)
            request_arrival.reset(arrival)

    async def _traced(self, scope: Scope, receive: Receive, send: Send, rid: str) -> None:
        method, path = scope["method"], scope["path"]
        route = path if path in self.routes else _template(path)
        parent = propagate.extract({k.decode("latin-1"): v.decode("latin-1")
                                    for k, v in scope["headers"]})
        name = f"{method} {route}" if route else method
        attributes = {"http.request.method": method, "url.path": path, "radixmesh.rid": rid}
        if route:
            attributes["http.route"] = route
        with _tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER,
                                           attributes=attributes) as span:
            status: list[int] = []
            await self.app(scope, receive, _with_ids(send, rid, tracing.trace_id_hex(span), status))
            if status:
                span.set_attribute("http.response.status_code", status[0])
                if status[0] >= 500:
                    span.set_status(trace.StatusCode.ERROR)


def _template(path: str) -> str | None:
    return "/v1/models/{model}" if path.startswith("/v1/models/") else None


def _with_ids(send: Send, rid: str, trace_id: str | None, status: list[int]) -> Send:
    extra = [(b"x-request-id", rid.encode())]
    if trace_id:
        extra.append((b"x-trace-id", trace_id.encode()))

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return wrapped
