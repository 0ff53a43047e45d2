"""Routing without the cache index, and resubmission when a worker dies early."""

from __future__ import annotations

import asyncio
import time

import pytest

from libs.protocol import ServiceError
from libs.protocol.messages import LoadReport, RouteReply, RouteRequest
from services.gateway.fallback import LoadView
from services.gateway.pipeline import GenerationRequest, PipelineConfig

from .conftest import MODEL


def load(worker: str, running: int) -> LoadReport:
    return LoadReport(worker_id=worker, scheduler_id="s", model=MODEL, running=running,
                      waiting=0, free_slots=100, total_slots=100, max_model_len=2048,
                      ts=time.time())


async def test_index_down_falls_back_to_least_loaded(played_no_index, pipeline, bus):
    played = played_no_index
    for report in (load("w1", running=5), load("w2", running=1)):
        await bus.publish(played.subjects.index_load(report.worker_id), report)
    await bus.nc.flush()
    gen = await pipeline.submit(GenerationRequest(text="hello", max_new_tokens=4))
    async with gen:
        done = await gen.collect()
    assert done.finish_reason == "length" and gen.worker_id == "w2"
    assert pipeline.loads.fallback_routes == 1


@pytest.fixture()
async def played_no_index(bus, subject_prefix):
    from libs.protocol import Subjects

    from .conftest import PlayedServices
    return await PlayedServices(bus, Subjects(subject_prefix), route_down=True).start()


async def test_index_down_and_no_known_worker_is_a_clear_503(played_no_index, pipeline):
    with pytest.raises(ServiceError) as err:
        await pipeline.submit(GenerationRequest(text="hello", max_new_tokens=4))
    assert err.value.status == 503


async def test_a_route_an_index_replica_died_holding_is_asked_again(played_no_index, pipeline, bus):
    """The first route is taken and never answered (its replica died): the retry is answered
    by another replica; no fallback to the gateway's own load view."""
    pipeline.config = PipelineConfig(request_timeout=2.0, bus_timeout=2.0, route_timeout=0.3)
    asked: list[str] = []

    async def replica(req: RouteRequest) -> RouteReply:
        asked.append(req.rid)
        if len(asked) == 1:
            await asyncio.Event().wait()
        return RouteReply(worker_id="w2", policy="cache_aware")

    await bus.subscribe(played_no_index.subjects.index_route(), replica, RouteRequest, concurrent=True)
    gen = await pipeline.submit(GenerationRequest(text="hello", max_new_tokens=4))
    async with gen:
        done = await gen.collect()
    assert done.finish_reason == "length" and gen.worker_id == "w2"
    assert len(asked) == 2 and asked[0] == asked[1] and pipeline.loads.fallback_routes == 0


async def test_worker_lost_before_first_token_moves_the_request(played, pipeline):
    played.lost_workers = {"w1"}
    gen = await pipeline.submit(GenerationRequest(text="hello", max_new_tokens=4))
    public = gen.rid
    async with gen:
        done = await gen.collect()
    assert done.text == "w0 w1 w2 w3 " and gen.rid == public and gen.worker_id == "w2"
    assert gen.retries == 1 and played.routes[-1].exclude == ["w1"]
    await pipeline.drain()
    assert {r.worker_id for r in played.releases} >= {"w1"}


async def test_worker_lost_mid_stream_resumes_from_the_delivered_output(played, pipeline):
    played.lost_workers, played.lost_after = {"w1"}, 2
    gen = await pipeline.submit(GenerationRequest(text="hello", max_new_tokens=4))
    async with gen:
        done = await gen.collect()
    # the client sees every word once, in order, under one public id
    assert done.text == "w0 w1 w2 w3 " and done.token_ids == [100, 101, 102, 103]
    assert gen.worker_id == "w2" and gen.retries == 1
    assert done.usage.prompt_tokens == 5 and done.usage.completion_tokens == 4
    first, resumed = played.submits
    assert resumed.input_ids == first.input_ids + [100, 101] and resumed.num_output_tokens == 2
    assert resumed.sampling.seed == first.sampling.seed is not None  # one seed for both
    enc = played.encodes[-1]
    assert enc.input_ids == first.input_ids and enc.text is None
    assert enc.output_ids == [100, 101] and enc.emitted_chars == len("w0 w1 ")
    await pipeline.drain()
    assert pipeline.open_requests == 0


async def test_no_worker_left_is_a_fast_503(played, pipeline):
    played.lost_workers, played.lost_after = {"w1", "w2"}, 1
    gen = await pipeline.submit(GenerationRequest(text="hello", max_new_tokens=4))
    started = time.monotonic()
    with pytest.raises(ServiceError) as err:
        async with gen:
            await gen.collect()
    assert (err.value.code, err.value.status) == ("no_worker", 503)
    assert time.monotonic() - started < 2.0
    assert gen.error is err.value and gen.retries == 2
    await pipeline.drain()
    assert pipeline.open_requests == 0


async def test_retries_are_bounded(bus, subject_prefix, pipeline):
    from libs.protocol import Subjects

    from .conftest import PlayedServices
    workers = ["w1", "w2", "w3", "w4", "w5", "w6"]
    played = await PlayedServices(bus, Subjects(subject_prefix), workers=workers,
                                  lost_workers=set(workers[:5]), lost_after=1, words=9).start()
    gen = await pipeline.submit(GenerationRequest(text="hello", max_new_tokens=9))
    with pytest.raises(ServiceError) as err:
        async with gen:
            await gen.collect()
    assert err.value.code == "worker_lost" and gen.retries == gen.MAX_RETRIES
    assert len(played.submits) == gen.MAX_RETRIES + 1


def test_load_view_tells_a_lost_scheduler():
    now = [100.0]
    view = LoadView(clock=lambda: now[0], stale_s=5.0)

    def hear(session: str) -> None:
        report = load("w1", running=1)
        report.session = session
        view._reports["w1"] = (report, now[0])

    hear("s1")
    now[0] = 101.0
    assert view.lost("w1", "s1", since=100.5) is None
    assert view.lost("w9", "s1", since=100.5) is None  # never heard of: no verdict
    assert view.lost("w1", "", since=100.5) is None  # an old scheduler: no session
    hear("s1")
    now[0] = 101.5
    hear("s2")  # a new session took the worker: requests of s1 are gone
    assert "new scheduler session" in view.lost("w1", "s1", since=101.2)
    assert view.lost("w1", "s1", since=101.6) is None  # s2's report predates the request
    now[0] = 107.0  # and then silence
    assert "no load report" in view.lost("w1", "s2", since=101.6)


async def test_watchdog_moves_requests_off_a_replaced_session(played, pipeline, bus):
    played.mode = "hang"
    gen = await pipeline.submit(GenerationRequest(text="hello", max_new_tokens=4))
    async with gen:
        first = await gen.next_delta()
        assert first.text == "a" and gen.session == "w1-s1"
        report = load("w1", running=0)
        report.session = "w1-s2"  # the scheduler restarted
        await bus.publish(played.subjects.index_load("w1"), report)
        second = await asyncio.wait_for(gen.next_delta(), 5)
        # the worker itself is fine: the request resumes there, under the new session
        assert second.text == "a" and gen.worker_id == "w1" and gen.retries == 1
        assert played.routes[-1].exclude == [] and gen.bus_rid != played.submits[0].rid
        await asyncio.sleep(0.6)  # the watchdog leaves the resumed submission alone
        assert len(played.submits) == 2
    resumed = played.submits[-1]
    assert resumed.num_output_tokens == 1 and resumed.input_ids[-1] == 7


async def test_a_worker_between_schedulers_is_waited_for_a_model_nobody_serves_is_not():
    now = [100.0]
    view = LoadView(clock=lambda: now[0])
    leaving = load("w1", running=0)
    leaving.alive = False  # its scheduler let go of it (a rolling restart)
    await view._on_load(load("w1", running=1))
    await view._on_load(leaving)
    assert view.pick(MODEL, []) is None  # nothing routable right now
    assert view.heard_within(MODEL, 8.0)  # but it reported lately: worth a wait
    assert not view.heard_within("another-model", 8.0)
    now[0] += 9.0
    assert not view.heard_within(MODEL, 8.0)
