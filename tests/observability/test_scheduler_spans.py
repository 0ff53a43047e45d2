"""The scheduler's request spans, driven by the real scheduler core (no bus, no worker)."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libs.protocol.messages import ForwardResult, SamplingParams, WorkerInfo
from services.scheduler import tracing as sched_tracing
from services.scheduler.config import CoreConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.request import Req
from services.scheduler.tracing import TOKEN_EVENT_EVERY, StepTracer

INFO = WorkerInfo(worker_id="w", model="m", kv_slots=4096, max_requests=8, max_model_len=2048,
                  vocab_size=1000, eos_token_ids=[0], dtype="float32")


@pytest.fixture
def exporter(monkeypatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(sched_tracing, "_tracer", provider.get_tracer("scheduler"))
    exporter.tracer = provider.get_tracer("test")
    return exporter


def request(i: int, new_tokens: int = 40) -> Req:
    return Req(rid=f"r{i}", input_ids=[i + 1] * 40, detok_instance="t",
               sampling=SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))


def run(core: SchedulerCore, tracer: StepTracer) -> list:
    """Step until done; returns the context step_started gave for each step."""
    contexts = []
    while core.has_work():
        batch = core.next_batch()
        plan = core.last_step
        contexts.append(tracer.step_started(plan))
        core.complete(ForwardResult(step=batch.step, next_token_ids=[5] * len(plan.items),
                                       forward_ms=0))
        tracer.step_done(plan)
        tracer.finished(core.take_delta_batches())
    return contexts


def test_queue_prefill_decode_and_retraction_spans(exporter):
    core = SchedulerCore(INFO, CoreConfig(chunked_prefill_size=16, retract_interval=7))
    tracer = StepTracer("w")
    with exporter.tracer.start_as_current_span("submit") as submit:
        for i in range(2):
            core.submit(req := request(i))
            tracer.submitted(req)
    core.submit(untraced := request(2))
    tracer.submitted(untraced)  # outside any trace: costs nothing, no spans
    assert set(tracer.traces) == {"r0", "r1"}
    contexts = run(core, tracer)
    assert not tracer.traces

    spans = exporter.get_finished_spans()
    roots = {s.attributes["radixmesh.rid"]: s for s in spans if s.name == "scheduler.request"}
    assert set(roots) == {"r0", "r1"}
    retractions = 0
    for rid, root in roots.items():
        assert root.parent.span_id == submit.get_span_context().span_id
        assert root.attributes["radixmesh.finish_reason"] == "length"
        assert root.attributes["radixmesh.completion_tokens"] == 40
        children = [s for s in spans if s.parent is not None
                    and s.parent.span_id == root.context.span_id]
        kinds = [s.name for s in children]
        retracted = sum(e.name == "retracted" for e in root.events)
        retractions += retracted
        assert kinds.count("scheduler.queue") == 1 + retracted
        # each queue span ends at its admission (a resumed request's may be a decode-only
        # step, which the tracer otherwise skips), not at the finish
        assert all("radixmesh.cached_tokens" in s.attributes for s in children if s.name == "scheduler.queue")
        assert kinds.count("scheduler.decode") == 1 + retracted
        assert kinds.count("scheduler.prefill") >= 3  # 40 tokens in 16-token chunks (a resume
        # finds prompt + output in the cache: it goes straight back to decoding)
        decodes = sorted((s for s in children if s.name == "scheduler.decode"), key=lambda s: s.start_time)
        assert decodes[0].events[0].name == "first_token"
        assert all(d.events[0].name == "resumed" for d in decodes[1:])
        counts = [e.attributes["radixmesh.completion_tokens"] for d in decodes for e in d.events]
        assert counts == sorted(counts) and counts[-1] >= 40 - TOKEN_EVENT_EVERY
        assert all(s.end_time >= s.start_time for s in children)
    assert retractions >= 1
    # a step that prefills a traced request is sent in that chunk's context
    chunk_steps = {s.attributes["radixmesh.step"] for s in spans if s.name == "scheduler.prefill"}
    sent_in = {trace.get_current_span(c).attributes["radixmesh.step"] for c in contexts if c is not None}
    assert sent_in == chunk_steps


def test_untraced_requests_cost_no_spans(exporter):
    core = SchedulerCore(INFO, CoreConfig())
    tracer = StepTracer("w")
    for i in range(3):
        core.submit(req := request(i, 4))
        tracer.submitted(req)
    assert all(c is None for c in run(core, tracer))
    assert exporter.get_finished_spans() == ()


def test_abort_while_queued_ends_the_spans(exporter):
    core = SchedulerCore(INFO, CoreConfig(max_running_requests=1))
    tracer = StepTracer("w")
    with exporter.tracer.start_as_current_span("submit"):
        for i in range(2):
            core.submit(req := request(i, 4))
            tracer.submitted(req)
    batch = core.next_batch()
    tracer.step_started(core.last_step)
    core.abort("r1")  # still queued behind r0
    tracer.finished(core.take_delta_batches())
    (root,) = [s for s in exporter.get_finished_spans() if s.name == "scheduler.request"]
    assert root.attributes["radixmesh.rid"] == "r1"
    assert root.attributes["radixmesh.finish_reason"] == "abort"
    queues = [s for s in exporter.get_finished_spans() if s.name == "scheduler.queue"]
    assert sum(q.parent.span_id == root.context.span_id for q in queues) == 1  # ended by the abort
    assert set(tracer.traces) == {"r0"}


def test_the_queue_span_says_how_much_came_back_from_the_host_tier(exporter):
    info = WorkerInfo(worker_id="w", model="m", kv_slots=96, max_requests=4, max_model_len=512,
                      vocab_size=1000, eos_token_ids=[0], dtype="float32", host_kv_slots=512)
    core = SchedulerCore(info, CoreConfig(page_size=8))
    tracer = StepTracer("w")
    docs = [[7 + d] * 40 for d in range(3)]  # three documents, two fit on the device
    with exporter.tracer.start_as_current_span("submit"):
        for i in range(4):
            core.submit(r := Req(rid=f"r{i}", input_ids=docs[i % 3] + [900 + i], detok_instance="t",
                                 sampling=SamplingParams(max_new_tokens=2, ignore_eos=True)))
            tracer.submitted(r)
            run(core, tracer)
    queues = {s.parent.span_id: s for s in exporter.get_finished_spans() if s.name == "scheduler.queue"}
    last = next(s for s in exporter.get_finished_spans()
                if s.name == "scheduler.request" and s.attributes["radixmesh.rid"] == "r3")
    queue = queues[last.context.span_id]
    assert queue.attributes["radixmesh.cached_host_tokens"] == 40  # r0's document, loaded back
    assert queue.attributes["radixmesh.cached_store_tokens"] == 0  # no store: nothing fetched
    assert queue.attributes["radixmesh.cached_tokens"] == 40


def test_a_request_admitted_on_a_decode_only_step_ends_its_queue_span_there(exporter):
    """A decode worker's request arrives with its prompt's KV (prefill/decode): its first step
    is a decode. The tracer skips decode-only steps only while no traced request waits."""
    from services.scheduler.step import Step, StepItem

    tracer = StepTracer("w")
    with exporter.tracer.start_as_current_span("submit"):
        tracer.submitted(req := request(0))
    tracer.step_started(Step(items=[StepItem(req, 1, decode=True, prefix_len=40)], decode_only=True))
    queue = [s for s in exporter.get_finished_spans() if s.name == "scheduler.queue"]
    assert len(queue) == 1 and queue[0].attributes["radixmesh.cached_tokens"] == 40
    assert tracer.unsettled == {"r0"}  # admitted, not decoding yet
    # later decode-only steps take no pass over the requests and start no span
    assert tracer.step_started(Step(items=[StepItem(req, 1, decode=True)], decode_only=True)) is None
