"""libs.protocol.tracing: only traced work crosses the bus with spans; logs carry the ids."""

from __future__ import annotations

import asyncio
import logging

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libs.protocol import Bus, Subjects
from libs.protocol import metrics, tracing
from libs.protocol.errors import ServiceError
from libs.protocol.messages import Ping, Pong


@pytest.fixture
def exporter(monkeypatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("bus"))
    exporter.tracer = provider.get_tracer("test")
    return exporter


@pytest.fixture
async def bus(nats_server):
    bus = await Bus.connect(nats_server.url, "obs-test")
    yield bus
    await bus.close()


async def test_background_traffic_is_not_traced(bus, subject_prefix, exporter):
    subject = Subjects(subject_prefix).ping("probe")
    seen: asyncio.Queue = asyncio.Queue()

    async def handler(_: Ping) -> Pong:
        await seen.put(trace.get_current_span().get_span_context())
        return Pong(service="probe", instance="p", uptime_s=0.0)

    # subscribed inside a trace: its handler must not inherit that trace later
    with exporter.tracer.start_as_current_span("setup"):
        await bus.subscribe(subject, handler, Ping)
    exporter.clear()
    await bus.request(subject, Ping(), Pong)
    assert not (await seen.get()).is_valid
    assert exporter.get_finished_spans() == ()

    with exporter.tracer.start_as_current_span("request") as root:
        await bus.request(subject, Ping(), Pong)
    assert (await seen.get()).trace_id == root.get_span_context().trace_id
    kinds = {s.kind for s in exporter.get_finished_spans()}
    assert kinds == {trace.SpanKind.INTERNAL, trace.SpanKind.PRODUCER, trace.SpanKind.CONSUMER}


async def test_transport_failures_are_counted_and_mark_the_span(bus, subject_prefix, exporter):
    subject = Subjects(subject_prefix).ping("nobody")
    label = metrics.subject_label(subject)
    before = metrics.BUS_ERRORS.labels(label, "service_unavailable")._value.get()
    with exporter.tracer.start_as_current_span("request"):
        with pytest.raises(ServiceError):
            await bus.request(subject, Ping(), Pong, timeout=0.5)
    with pytest.raises(ServiceError):  # untraced: counted all the same
        await bus.request(subject, Ping(), Pong, timeout=0.5)
    assert metrics.BUS_ERRORS.labels(label, "service_unavailable")._value.get() == before + 2
    (producer,) = [s for s in exporter.get_finished_spans() if s.kind == trace.SpanKind.PRODUCER]
    assert producer.status.status_code == trace.StatusCode.ERROR


@pytest.fixture
def log_context():
    before = logging.getLogRecordFactory()
    tracing.install_log_context()
    yield
    logging.setLogRecordFactory(before)


def test_log_lines_carry_request_and_trace_ids(exporter, caplog, log_context):
    log = logging.getLogger("radixmesh.test")
    with caplog.at_level(logging.INFO, logger="radixmesh.test"):
        log.info("outside %s", "any request")
        token = tracing.request_id.set("rid-1")
        try:
            with exporter.tracer.start_as_current_span("handling") as span:
                log.info("routed %s", "x")
        finally:
            tracing.request_id.reset(token)
    outside, inside = [r.getMessage() for r in caplog.records]
    assert outside == "outside any request"
    assert inside == f"routed x [rid=rid-1 trace={span.get_span_context().trace_id:032x}]"
    assert tracing.trace_id_hex() is None
