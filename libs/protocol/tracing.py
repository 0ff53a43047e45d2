"""W3C trace-context propagation through NATS headers.

Only the transport wrapper calls these; business code never sees headers.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

_tracer = trace.get_tracer("radixmesh.bus")


def inject_headers(headers: dict[str, str] | None = None) -> dict[str, str]:
    carrier: dict[str, str] = dict(headers or {})
    propagate.inject(carrier)
    return carrier


@contextmanager
def producer_span(subject: str, operation: str = "publish") -> Iterator[None]:
    with _tracer.start_as_current_span(
        f"{operation} {subject}",
        kind=trace.SpanKind.PRODUCER,
        attributes={
            "messaging.system": "nats",
            "messaging.destination.name": subject,
            "messaging.operation.type": operation,
        },
    ):
        yield


@contextmanager
def consumer_span(subject: str, headers: dict[str, str] | None) -> Iterator[None]:
    """Run the handler inside the sender's context, under a CONSUMER span."""
    parent = propagate.extract(headers or {})
    token = otel_context.attach(parent)
    try:
        with _tracer.start_as_current_span(
            f"process {subject}",
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": subject,
                "messaging.operation.type": "process",
            },
        ):
            yield
    finally:
        otel_context.detach(token)
