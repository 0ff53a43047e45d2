"""The transport wrapper against a real nats-server."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.messages import AbortRequest, Ping, Pong, RouteReply, RouteRequest


async def test_request_reply_roundtrip(nats_server, subject_prefix):
    subjects = Subjects(subject_prefix)
    bus = await Bus.connect(nats_server.url, "test")
    try:
        async def route(msg: RouteRequest) -> RouteReply:
            return RouteReply(worker_id=f"w-{msg.num_tokens}", policy="least_load")

        await bus.subscribe(subjects.index_route(), route, RouteRequest)
        reply = await bus.request(
            subjects.index_route(), RouteRequest(rid="r1", model="m", num_tokens=7), RouteReply
        )
        assert reply == RouteReply(worker_id="w-7", policy="least_load")
    finally:
        await bus.close()


async def test_handler_error_becomes_typed_error(nats_server, subject_prefix):
    subjects = Subjects(subject_prefix)
    bus = await Bus.connect(nats_server.url, "test")
    try:
        async def fail(msg: RouteRequest) -> RouteReply:
            raise ServiceError("overloaded", f"{msg.rid} refused", 503)

        async def crash(msg: RouteRequest) -> RouteReply:
            raise KeyError("boom")

        await bus.subscribe(subjects.index_route(), fail, RouteRequest)
        await bus.subscribe(subjects.index_workers(), crash, RouteRequest)
        with pytest.raises(ServiceError) as err:
            await bus.request(subjects.index_route(), RouteRequest(rid="r9", model="m", num_tokens=1), RouteReply)
        assert (err.value.code, err.value.status, err.value.message) == ("overloaded", 503, "r9 refused")
        with pytest.raises(ServiceError) as err:
            await bus.request(subjects.index_workers(), RouteRequest(rid="r", model="m", num_tokens=1), RouteReply)
        assert err.value.code == "internal_error" and "boom" in err.value.message
        # a message of the wrong type is a typed 400, not a crash
        with pytest.raises(ServiceError) as err:
            await bus.request(subjects.index_route(), Ping(), RouteReply)
        assert err.value.status == 400
    finally:
        await bus.close()


async def test_no_responder_and_timeout_are_typed(nats_server, subject_prefix):
    subjects = Subjects(subject_prefix)
    bus = await Bus.connect(nats_server.url, "test")
    try:
        with pytest.raises(ServiceError) as err:
            await bus.request(subjects.ping("nobody"), Ping(), Pong, timeout=1.0)
        assert err.value.code == "service_unavailable"

        async def slow(_: Ping) -> Pong:
            await asyncio.sleep(1.0)
            return Pong(service="s", instance="i", uptime_s=0)

        await bus.subscribe(subjects.ping("slow"), slow, Ping)
        with pytest.raises(ServiceError) as err:
            await bus.request(subjects.ping("slow"), Ping(), Pong, timeout=0.2)
        assert err.value.code == "timeout"
    finally:
        await bus.close()


async def test_trace_context_rides_in_headers(nats_server, subject_prefix):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    subjects = Subjects(subject_prefix)
    bus = await Bus.connect(nats_server.url, "test")
    seen: asyncio.Queue = asyncio.Queue()
    trace._TRACER_PROVIDER = None  # noqa: SLF001 - allow setting the provider in tests
    trace.set_tracer_provider(provider)
    try:
        async def on_abort(msg: AbortRequest) -> None:
            await seen.put(trace.get_current_span().get_span_context().trace_id)

        await bus.subscribe(subjects.sched_abort("w1"), on_abort, AbortRequest)
        with tracer.start_as_current_span("root") as root:
            await bus.publish(subjects.sched_abort("w1"), AbortRequest(rid="r1"))
            root_trace = root.get_span_context().trace_id
        assert await asyncio.wait_for(seen.get(), 5) == root_trace
        kinds = {s.kind for s in exporter.get_finished_spans() if s.context.trace_id == root_trace}
        assert {trace.SpanKind.PRODUCER, trace.SpanKind.CONSUMER} <= kinds
    finally:
        await bus.close()
        provider.shutdown()
