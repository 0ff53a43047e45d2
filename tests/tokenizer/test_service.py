"""The tokenizer service over a real nats-server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from contextlib import AsyncExitStack

import pytest

from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.messages import (
    AbortRequest, ChatMessage, DetokBatch, DetokRelease, EncodeReply, EncodeRequest,
    GatewayBatch, Ping, Pong, TokenDelta,
)
from libs.protocol.service import CommonConfig, ServiceContext
from services.tokenizer.service import TokenizerService

INSTANCE = "tok-test"


class Harness:
    """A TokenizerService on the bus plus a client that plays gateway and scheduler."""

    def __init__(self, service: TokenizerService, client: Bus, subjects: Subjects) -> None:
        self.service, self.client, self.subjects = service, client, subjects
        self.gw: asyncio.Queue[GatewayBatch] = asyncio.Queue()
        self.aborts: asyncio.Queue[AbortRequest] = asyncio.Queue()

    async def encode(self, **kw) -> EncodeReply:
        req = EncodeRequest(gateway="gw-a", **kw)
        return await self.client.request(self.subjects.tokenizer_encode(), req, EncodeReply)

    async def detok(self, *items: TokenDelta) -> None:
        msg = DetokBatch(worker_id="w-1", step=0, items=list(items))
        await self.client.publish(self.subjects.tokenizer_detok(INSTANCE), msg)

    async def next_batch(self) -> GatewayBatch:
        return await asyncio.wait_for(self.gw.get(), 5)


@pytest.fixture()
async def harness(nats_server, subject_prefix, encoder):
    subjects = Subjects(subject_prefix)
    async with AsyncExitStack() as stack:
        bus = await Bus.connect(nats_server.url, "tokenizer-under-test")
        stack.push_async_callback(bus.close)
        config = CommonConfig(nats_server.url, subject_prefix, INSTANCE, "INFO")
        ctx = ServiceContext("tokenizer", config, bus, asyncio.Event(), stack)
        service = TokenizerService(ctx, encoder, "SmolLM2-135M-Instruct", idle_timeout=0.4)
        await service.start()
        client = await Bus.connect(nats_server.url, "client")
        stack.push_async_callback(client.close)
        h = Harness(service, client, subjects)
        await client.subscribe(subjects.gateway_out("gw-a"), h.gw.put, GatewayBatch)
        await client.subscribe(subjects.sched_abort("w-1"), h.aborts.put, AbortRequest)
        yield h


async def test_encode_over_the_bus_opens_a_stream(harness, tokenizer):
    reply = await harness.encode(rid="r1", messages=[ChatMessage(role="user", content="Hi")])
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True,
        return_dict=False,
    )
    assert reply.input_ids == list(expected) and reply.detok_instance == INSTANCE
    assert reply.max_model_len == 8192 and reply.max_new_tokens == 8192 - len(expected)
    assert harness.service.ctx.detail == {"model": "SmolLM2-135M-Instruct", "detok_streams": "1"}


async def test_bad_encode_requests_get_typed_errors(harness):
    with pytest.raises(ServiceError) as err:
        await harness.encode(rid="r1", text="a", input_ids=[1])
    assert (err.value.code, err.value.status) == ("invalid_request_error", 400)
    with pytest.raises(ServiceError) as err:
        await harness.encode(rid="r2", input_ids=[3] * 9000)
    assert (err.value.code, err.value.status) == ("context_length_exceeded", 400)
    assert len(harness.service.streams) == 0


async def test_detok_batch_becomes_one_gateway_batch(harness, tokenizer):
    await harness.encode(rid="r1", text="x")
    await harness.encode(rid="r2", text="y")
    hello, cafe = tokenizer.encode("Hello"), tokenizer.encode(" café")
    await harness.detok(
        TokenDelta(rid="r1", token_ids=hello), TokenDelta(rid="gone", token_ids=hello),
        TokenDelta(rid="r2", token_ids=cafe, finish_reason="length", completion_tokens=len(cafe)),
    )
    out = await harness.next_batch()
    assert [(d.rid, d.text, d.token_ids, d.finish_reason) for d in out.items] == [
        ("r1", "Hello", hello, None), ("r2", " café", cafe, "length"),
    ]
    assert out.items[1].usage.completion_tokens == len(cafe)
    assert harness.gw.empty() and len(harness.service.streams) == 1


async def test_stop_string_publishes_abort_to_the_scheduler(harness, tokenizer):
    await harness.encode(rid="r1", text="x", stop=["</answer>"])
    await harness.detok(TokenDelta(rid="r1", token_ids=tokenizer.encode("42 </ans")))
    assert (await harness.next_batch()).items[0].text == "42 "
    await harness.detok(TokenDelta(rid="r1", token_ids=tokenizer.encode("wer> tail")))
    final = (await harness.next_batch()).items[0]
    assert (final.text, final.finish_reason) == ("", "stop")
    abort = await asyncio.wait_for(harness.aborts.get(), 5)
    assert abort == AbortRequest(rid="r1", reason="stop")
    # the scheduler's abort echo is ignored silently
    await harness.detok(TokenDelta(rid="r1", token_ids=[], finish_reason="abort"))
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(harness.gw.get(), 0.3)


async def test_release_and_idle_sweep_drop_streams(harness):
    await harness.encode(rid="r1", text="x")
    await harness.encode(rid="r2", text="y")
    subject = harness.subjects.tokenizer_detok(INSTANCE)
    await harness.client.publish(subject, DetokRelease(rids=["r1"]))
    await harness.client.nc.flush()
    await asyncio.sleep(0.1)
    assert "r1" not in harness.service.streams and "r2" in harness.service.streams
    await asyncio.sleep(0.8)  # idle_timeout is 0.4 s
    assert len(harness.service.streams) == 0
    assert harness.service.ctx.detail["detok_streams"] == "0"


async def test_cli_process_serves_ping_and_encode(nats_server, subject_prefix):
    env = {**os.environ, "RADIXMESH_SUBJECT_PREFIX": subject_prefix}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.tokenizer", "--model", "default",
         "--nats-url", nats_server.url, "--instance", "tok-cli"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    subjects = Subjects(subject_prefix)
    client = await Bus.connect(nats_server.url, "client")
    try:
        pong = None
        for _ in range(150):
            try:
                pong = await client.request(subjects.ping("tokenizer"), Ping(), Pong, timeout=0.2)
                break
            except ServiceError:
                assert proc.poll() is None, proc.stderr.read().decode()
                await asyncio.sleep(0.1)
        assert pong is not None and pong.instance == "tok-cli"
        assert pong.detail["model"] == "SmolLM2-135M-Instruct"
        reply = await client.request(
            subjects.tokenizer_encode(), EncodeRequest(rid="r", gateway="g", text="Hi"), EncodeReply
        )
        assert reply.detok_instance == "tok-cli" and reply.input_ids
    finally:
        await client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


async def test_resumed_encode_primes_the_stream(harness, tokenizer):
    ids = tokenizer.encode("Tokyo 東京 👍🏽")
    split = next(k for k in range(1, len(ids)) if "\ufffd" in tokenizer.decode(ids[:k]))
    sent = tokenizer.decode(ids[:split]).rstrip("\ufffd")  # what the client got
    prompt = tokenizer.encode("Dessert:")
    reply = await harness.encode(rid="r9", input_ids=prompt, output_ids=ids[:split],
                                 emitted_chars=len(sent))
    assert reply.input_ids == prompt
    await harness.detok(TokenDelta(rid="r9", token_ids=ids[split:], finish_reason="length"))
    (delta,) = (await harness.next_batch()).items
    assert sent + delta.text == "Tokyo 東京 👍🏽"
    assert delta.usage.completion_tokens == len(ids)  # counted from the replayed ids on


@pytest.mark.parametrize("kw", [{"output_ids": [-1]}, {"output_ids": [10**9]},
                                {"output_ids": [5], "emitted_chars": -1}])
async def test_bad_resume_is_400(harness, kw):
    with pytest.raises(ServiceError) as err:
        await harness.encode(rid="bad", input_ids=[1, 2], **kw)
    assert err.value.status == 400 and "bad" not in harness.service.streams


async def test_open_streams_are_bounded(harness):
    harness.service.max_streams = 2
    await harness.encode(rid="a", text="x")
    await harness.encode(rid="b", text="y")
    with pytest.raises(ServiceError) as err:
        await harness.encode(rid="c", text="z")
    assert (err.value.code, err.value.status) == ("overloaded", 503)
    await harness.encode(rid="a", text="x")  # a retried encode reopens its own stream
