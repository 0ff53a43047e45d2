"""W3C trace-context propagation through NATS headers, and request context in logs.

Only the transport wrapper calls the span helpers; business code never sees headers.

NOTE: only messages sent inside a trace are traced. A publish with no current
span (heartbeats, load reports, KV events, batched per-step traffic) creates no
span and sends no headers, and a message without ``traceparent`` is handled in an
empty context, so background traffic never floods the trace store nor attaches
itself to whichever request happened to start a background task. A request's
spans therefore form one trace from the gateway to the worker.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from . import metrics
from .errors import ServiceError

_tracer = trace.get_tracer("radixmesh.bus")
_TRACEPARENT = "traceparent"
_EMPTY = otel_context.Context()

# The public id of the request being handled (set by the gateway per HTTP request).
request_id: ContextVar[str | None] = ContextVar("radixmesh_request_id", default=None)


def in_trace() -> bool:
    """True when a (possibly remote) span is current: messages sent now join its trace."""
    return trace.get_current_span().get_span_context().is_valid


def inject_headers(headers: dict[str, str] | None = None) -> dict[str, str]:
    carrier: dict[str, str] = dict(headers or {})
    propagate.inject(carrier)
    return carrier


@contextmanager
def producer_span(subject: str, operation: str = "publish") -> Iterator[None]:
    """A PRODUCER span around a publish / request when a trace is current.

    Transport failures (no responder, timeout) are counted in
    ``radixmesh:bus_errors_total`` and mark the span as failed.
    """
    try:
        if not in_trace():
            yield
            return
        with _tracer.start_as_current_span(f"{operation} {subject}", kind=trace.SpanKind.PRODUCER,
                                           attributes=_messaging(subject, operation)):
            yield
    except ServiceError as exc:
        metrics.bus_error(subject, exc.code)
        raise


@contextmanager
def consumer_span(subject: str, headers: dict[str, str] | None) -> Iterator[None]:
    """Run the handler inside the sender's context, under a CONSUMER span.

    Without ``traceparent`` the handler runs in an empty context (no span).
    """
    if not headers or _TRACEPARENT not in headers:
        token = otel_context.attach(_EMPTY)
        try:
            yield
        finally:
            otel_context.detach(token)
        return
    token = otel_context.attach(propagate.extract(headers))
    try:
        with _tracer.start_as_current_span(f"process {subject}", kind=trace.SpanKind.CONSUMER,
                                           attributes=_messaging(subject, "process")):
            yield
    finally:
        otel_context.detach(token)


def handler_failed(subject: str, code: str, message: str = "") -> None:
    """A handler answered with a typed error: count it and mark the current span."""
    metrics.bus_error(subject, code)
    span = trace.get_current_span()
    if span.is_recording():
        span.set_status(trace.StatusCode.ERROR, f"{code}: {message}" if message else code)


def trace_id_hex(span: trace.Span | None = None) -> str | None:
    """The 32-hex trace id of ``span`` (default: the current one), None outside a trace."""
    ctx = (span or trace.get_current_span()).get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid else None


# -- logs ------------------------------------------------------------------------


class _ContextRecord(logging.LogRecord):
    """A LogRecord whose message ends in ``[rid=... trace=...]`` inside a request."""

    context = ""

    def getMessage(self) -> str:  # noqa: N802 - logging's API
        msg = super().getMessage()
        return f"{msg} [{self.context}]" if self.context else msg


def _record_factory(*args, **kwargs) -> logging.LogRecord:
    record = _ContextRecord(*args, **kwargs)
    parts = []
    rid = request_id.get()
    if rid:
        parts.append(f"rid={rid}")
    tid = trace_id_hex()
    if tid:
        parts.append(f"trace={tid}")
    if parts:
        record.context = " ".join(parts)
        record.request_id, record.trace_id = rid or "", tid or ""
    return record


def install_log_context() -> None:
    """Make every log line written while a request is handled carry its request id
    and trace id (idempotent; the format string is left as it is)."""
    logging.setLogRecordFactory(_record_factory)


def _messaging(subject: str, operation: str) -> dict[str, str]:
    """OpenTelemetry messaging attributes of one NATS operation."""
    return {"messaging.system": "nats", "messaging.destination.name": subject,
            "messaging.operation.type": operation}
