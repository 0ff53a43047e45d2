"""A request whose detokenizing tokenizer dies resumes through another one instead of
waiting out request_timeout; a tokenizer never heard from is never judged."""

from __future__ import annotations

import asyncio
import time

from libs.protocol import Subjects
from libs.protocol.messages import Ping, Pong
from services.gateway.pipeline import GenerationRequest, Pipeline, PipelineConfig
from services.gateway.tokenizers import TokenizerView

from . import conftest
from .conftest import GATEWAY, MODEL


async def answer_pings(bus, subjects: Subjects, instance: str, nonce: str = ""):
    async def pong(_: Ping) -> Pong:
        return Pong(service="tokenizer", instance=instance, uptime_s=1.0, detail={"nonce": nonce})

    sub = await bus.subscribe(subjects.ping("tokenizer"), pong, Ping)
    await bus.nc.flush()
    return sub


async def test_a_request_whose_tokenizer_died_resumes_through_another(played, bus, subject_prefix,
                                                                     monkeypatch):
    subjects = Subjects(subject_prefix)
    pipeline = Pipeline(bus, subjects, GATEWAY, MODEL, PipelineConfig(
        request_timeout=30.0, bus_timeout=2.0, tokenizer_probe_interval=0.05))
    first = await answer_pings(bus, subjects, conftest.DETOK)
    await pipeline.start()
    try:
        while conftest.DETOK not in pipeline.tokenizers._seen:  # its first probe answered
            await asyncio.sleep(0.05)
        played.mode = "hang"  # one delta, then its tokenizer dies: nothing more comes
        gen = await pipeline.submit(GenerationRequest(text="hello", max_new_tokens=4))
        async with gen:
            assert (await gen.next_delta()).text == "a"
            began = time.monotonic()
            await first.unsubscribe()  # dead; its successor encodes from now on
            monkeypatch.setattr(conftest, "DETOK", "tok-2")
            await answer_pings(bus, subjects, "tok-2")
            played.mode = "finish"
            done = await gen.collect()
        assert time.monotonic() - began < 5  # not request_timeout
        assert done.finish_reason == "length" and gen.retries == 1
        resumed = played.submits[-1]
        assert resumed.num_output_tokens == 1 and resumed.input_ids[-1] == 7  # prompt + "a"
        assert resumed.detok_instance == "tok-2" and played.routes[-1].exclude == []  # same worker may serve
        assert gen.worker_id == "w1"
    finally:
        await pipeline.stop()


async def test_only_an_instance_that_answered_and_then_went_silent_is_gone(bus, subject_prefix):
    subjects = Subjects(subject_prefix)
    view = TokenizerView(bus, subjects, timeout=0.1, misses=2)
    assert await view.gone({"never-heard"}) == set()
    sub = await answer_pings(bus, subjects, "tok-a")
    assert await view.gone({"tok-a", "never-heard"}) == set()
    await sub.unsubscribe()
    assert await view.gone({"tok-a"}) == set()  # one miss
    assert await view.gone({"tok-a"}) == {"tok-a"}  # two in a row
    await answer_pings(bus, subjects, "tok-a")
    assert await view.gone({"tok-a"}) == set()  # back


async def test_an_instance_restarted_under_its_id_is_gone_at_once(bus, subject_prefix):
    """Compose names a tokenizer by its hostname: its successor answers under the same id,
    with an empty stream table; its process nonce tells it apart."""
    subjects = Subjects(subject_prefix)
    view = TokenizerView(bus, subjects, timeout=0.1, misses=3)
    first = await answer_pings(bus, subjects, "tok-a", nonce="p1")
    assert await view.gone({"tok-a"}) == set()
    await first.unsubscribe()
    await answer_pings(bus, subjects, "tok-a", nonce="p2")
    assert await view.gone({"tok-a"}) == {"tok-a"}  # no misses needed
    assert await view.gone({"tok-a"}) == set()  # the successor itself is fine
