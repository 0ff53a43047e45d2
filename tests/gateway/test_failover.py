"""Routing without the cache index, and resubmission when a worker dies early."""

from __future__ import annotations

import time

import pytest

from libs.protocol import ServiceError
from libs.protocol.messages import LoadReport
from services.gateway.pipeline import GenerationRequest

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
