"""The pipeline's wiring, dispatch and cleanup against a real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libs.protocol import ServiceError, Subjects, errors
from libs.protocol import tracing as bus_tracing
from libs.protocol.messages import ChatMessage
from services.gateway import pipeline as pipeline_module
from services.gateway.pipeline import GenerationRequest, Pipeline, PipelineConfig
from services.gateway.sampling import unresolved


async def test_collect_runs_the_whole_path(played, pipeline):
    req = GenerationRequest(text="hello", max_new_tokens=4, params=unresolved(
        temperature=0.0, top_k=5, seed=3, stop=["\n"], stop_token_ids=[9]))
    gen = await pipeline.submit(req)
    assert pipeline.open_requests == 1
    async with gen:
        done = await gen.collect()
    assert done.text == "w0 w1 w2 w3 " and done.token_ids == [100, 101, 102, 103]
    assert done.finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.cached_tokens) == (5, 4, 2)
    enc, route, submit = played.encodes[0], played.routes[0], played.submits[0]
    assert enc.gateway == pipeline.instance and enc.text == "hello" and enc.stop == ["\n"]
    assert enc.rid == route.rid == submit.rid == gen.rid and len(gen.rid) == 32
    assert route.model == pipeline.model and route.num_tokens == 5 and not route.local_prefill
    assert submit.detok_instance == played.detok
    sp = submit.sampling
    assert (sp.max_new_tokens, sp.temperature, sp.top_k, sp.seed, sp.stop_token_ids) == (4, 0.0, 5, 3, [9])
    await pipeline.drain()
    await played.wait_for(played.releases)
    assert played.releases[0].rid == gen.rid and played.releases[0].worker_id == "w1"
    assert played.aborts == [] and played.detok_releases == []
    assert pipeline.open_requests == 0


@pytest.mark.parametrize("kind", ["return_logprob", "regex"])
async def test_a_request_a_decode_worker_prefills_itself_is_routed_as_one(played, pipeline, kind):
    req = GenerationRequest(text="hello", max_new_tokens=2,
                            params=unresolved(**{kind: True if kind == "return_logprob" else "[a-z]+"}))
    async with await pipeline.submit(req) as gen:
        await gen.collect()
    assert played.routes[0].local_prefill


async def test_stream_deltas_end_with_finish(played, pipeline):
    gen = await pipeline.submit(GenerationRequest(messages=[ChatMessage(role="user", content="hi")]))
    async with gen:
        deltas = [d async for d in gen]
    assert "".join(d.text for d in deltas) == "w0 w1 w2 w3 "
    assert [d.finish_reason for d in deltas][-1] == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert played.encodes[0].messages == [ChatMessage(role="user", content="hi")]
    assert played.submits[0].sampling.max_new_tokens == 100  # resolved by the tokenizer


async def test_close_before_finish_aborts_and_releases(played, pipeline):
    played.mode = "hang"
    gen = await pipeline.submit(GenerationRequest(text="x"))
    async with gen:
        first = await gen.next_delta()
        assert first.text == "a"
    assert pipeline.open_requests == 0
    await played.wait_for(played.aborts)
    await played.wait_for(played.releases)
    assert played.aborts[0].rid == gen.rid and played.aborts[0].reason == "abort"
    assert played.releases[0].worker_id == "w1"


async def test_error_finish_raises_typed_error(played, pipeline):
    played.mode = "error"
    gen = await pipeline.submit(GenerationRequest(text="x"))
    with pytest.raises(ServiceError) as err:
        async with gen:
            await gen.collect()
    assert (err.value.code, err.value.status) == ("model_error", 502)
    await played.wait_for(played.releases)
    assert played.aborts == []  # the scheduler ended it already


async def test_silence_times_out_and_aborts(played, pipeline):
    played.mode = "hang"
    pipeline.config = PipelineConfig(request_timeout=0.2, bus_timeout=2.0)
    gen = await pipeline.submit(GenerationRequest(text="x"))
    with pytest.raises(ServiceError) as err:
        async with gen:
            await gen.collect()
    assert (err.value.code, err.value.status) == ("timeout", 504)
    await played.wait_for(played.aborts)
    assert played.aborts[0].rid == gen.rid


async def test_encode_error_leaves_nothing_behind(played, pipeline):
    played.encode_error = errors.context_length_exceeded("prompt too long")
    with pytest.raises(ServiceError) as err:
        await pipeline.submit(GenerationRequest(text="x"))
    assert (err.value.code, err.value.status) == ("context_length_exceeded", 400)
    assert pipeline.open_requests == 0
    await pipeline.drain()
    assert played.routes == [] and played.detok_releases == [] and played.releases == []


async def test_overloaded_worker_is_excluded_and_retried(played, pipeline):
    played.submit_errors["w1"] = errors.overloaded("w1 is full")
    gen = await pipeline.submit(GenerationRequest(text="x"))
    assert gen.worker_id == "w2"
    assert [r.exclude for r in played.routes] == [[], ["w1"]]
    async with gen:
        await gen.collect()
    await pipeline.drain()
    await played.wait_for(played.releases, 2)
    assert sorted(r.worker_id for r in played.releases) == ["w1", "w2"]
    assert played.detok_releases == [] and played.aborts == []


async def test_refused_submit_releases_detok_and_booking(played, pipeline):
    played.submit_errors["w1"] = errors.invalid_request("bad sampling")
    with pytest.raises(ServiceError) as err:
        await pipeline.submit(GenerationRequest(text="x"))
    assert err.value.status == 400
    assert pipeline.open_requests == 0
    await played.wait_for(played.detok_releases)
    await played.wait_for(played.releases)
    assert played.detok_releases[0].rids == [played.encodes[0].rid]
    assert played.releases[0].worker_id == "w1" and played.aborts == []


async def test_all_workers_overloaded_gives_503(played, pipeline):
    for worker in played.workers:
        played.submit_errors[worker] = errors.overloaded(f"{worker} full")
    played.workers.append("w3")  # routed to, but nobody listens there
    with pytest.raises(ServiceError) as err:
        await pipeline.submit(GenerationRequest(text="x"))
    assert err.value.status == 503
    assert len(played.routes) == 3
    await played.wait_for(played.releases, 3)
    await played.wait_for(played.detok_releases)


async def test_unanswered_submit_launches_again_under_a_fresh_rid(played, pipeline):
    """A scheduler that dies holding the submit: after ``submit_timeout`` the
    request is abandoned there (abort + release) and launched again."""
    played.silent_submits = 1
    pipeline.config = PipelineConfig(request_timeout=2.0, submit_timeout=0.3)
    gen = await pipeline.submit(GenerationRequest(text="x"))
    async with gen:
        done = await gen.collect()
    assert done.text == "w0 w1 w2 w3 "
    first, second = played.submits
    assert first.rid == gen.rid != second.rid == gen.bus_rid
    assert [e.rid for e in played.encodes] == [first.rid, second.rid]
    await pipeline.drain()
    await played.wait_for(played.aborts)
    await played.wait_for(played.detok_releases)
    assert [a.rid for a in played.aborts] == [first.rid]
    assert played.detok_releases[0].rids == [first.rid]


async def test_submit_never_answered_gives_503(played, pipeline):
    played.silent_submits = 10
    pipeline.config = PipelineConfig(submit_timeout=0.2, submit_attempts=2)
    with pytest.raises(ServiceError) as err:
        await pipeline.submit(GenerationRequest(text="x"))
    assert (err.value.code, err.value.status) == ("submit_timeout", 503)
    assert len(played.submits) == 2 and pipeline.open_requests == 0
    await played.wait_for(played.aborts, 2)


async def test_no_tokenizer_is_unavailable(pipeline):
    with pytest.raises(ServiceError) as err:
        await pipeline.submit(GenerationRequest(text="x"))
    assert (err.value.code, err.value.status) == ("service_unavailable", 503)
    assert pipeline.open_requests == 0


async def test_concurrent_requests_get_their_own_output(played, pipeline):
    async def one(i: int) -> str:
        gen = await pipeline.submit(GenerationRequest(text=f"p{i}"))
        async with gen:
            return (await gen.collect()).text

    texts = await asyncio.gather(*(one(i) for i in range(8)))
    assert texts == ["w0 w1 w2 w3 "] * 8
    assert pipeline.open_requests == 0
    assert len({s.rid for s in played.submits}) == 8


async def test_cancelled_consumer_cleans_up(played, pipeline):
    played.mode = "hang"

    async def consume() -> None:
        gen = await pipeline.submit(GenerationRequest(text="x"))
        async with gen:
            await gen.collect()

    task = asyncio.create_task(consume())
    await played.wait_for(played.submits)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pipeline.open_requests == 0
    await played.wait_for(played.aborts)
    await played.wait_for(played.releases)


async def test_request_is_one_trace(played, pipeline, monkeypatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # NOTE: module tracers bind to the first global provider; point them at ours
    monkeypatch.setattr(pipeline_module, "_tracer", provider.get_tracer("gateway"))
    monkeypatch.setattr(bus_tracing, "_tracer", provider.get_tracer("bus"))
    played.mode = "hang"
    gen = await pipeline.submit(GenerationRequest(text="x"))
    async with gen:
        await gen.next_delta()
    await played.wait_for(played.aborts)
    await pipeline.drain()
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "gateway.request"]
    assert root.attributes["radixmesh.rid"] == gen.rid
    assert root.attributes["radixmesh.outcome"] == "aborted"
    assert root.attributes["radixmesh.worker"] == "w1"
    subjects = pipeline.subjects
    for subject in (subjects.tokenizer_encode(), subjects.index_route(),
                    subjects.sched_submit("w1"), subjects.sched_abort("w1")):
        consumer = [s for s in spans if s.name == f"process {subject}"]
        assert consumer and consumer[0].context.trace_id == root.context.trace_id, subject


async def test_submit_needs_start(bus, subject_prefix):
    pipe = Pipeline(bus, Subjects(subject_prefix), "gw-x", "m")
    with pytest.raises(RuntimeError, match="start"):
        await pipe.submit(GenerationRequest(text="x"))
    assert pipe.open_requests == 0
