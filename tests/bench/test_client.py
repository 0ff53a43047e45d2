import asyncio
import json

import httpx
import pytest

from radixmesh.bench.client import ClientConfig, StreamClient
from radixmesh.bench.record import Record, check

MESSAGES = [{"role": "user", "content": "Hello there"}]


def _sse(events, delay=0.02):
    async def body():
        for event in events:
            await asyncio.sleep(delay)
            yield f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n".encode()
    return body()


def _native(ids, finish=None, prompt=11, cached=3):
    return {"text": "x" * len(ids), "output_ids": ids,
            "meta_info": {"id": "rid1", "prompt_tokens": prompt, "completion_tokens": len(ids),
                          "cached_tokens": cached,
                          "cached_tokens_details": {"device": 0, "host": 1, "store": cached - 1},
                          "finish_reason": finish and {"type": finish}}}


def _client(handler, api="generate", chat_tok=None):
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://t")
    return http, StreamClient(http, chat_tok, ClientConfig(api=api, model="m"))


async def test_generate_gives_every_token_its_arrival_time(chat_tok):
    prompt_tokens = len(chat_tok.prompt_ids(MESSAGES))
    bodies = []

    def handler(request):
        bodies.append(json.loads(request.content))
        # the second event carries two tokens at once (merged deltas)
        events = [_native([5], prompt=prompt_tokens), _native([5, 6, 7], prompt=prompt_tokens),
                  _native([5, 6, 7, 2], "stop", prompt=prompt_tokens), "[DONE]"]
        return httpx.Response(200, content=_sse(events), headers={"x-radixmesh-worker": "w0"})

    http, client = _client(handler, chat_tok=chat_tok)
    record = Record("s", "r", "question")
    async with http:
        await client.send(MESSAGES, 8, record)
    assert record.ok, record.error
    assert bodies[0]["text"] == chat_tok.prompt(MESSAGES)
    assert bodies[0]["sampling_params"] == {"max_new_tokens": 8, "temperature": 0.0}
    assert (record.completion_tokens, record.stream_tokens, record.cached_tokens) == (4, 4, 3)
    assert (record.cached_host_tokens, record.cached_store_tokens) == (1, 2)
    assert record.client_prompt_tokens == record.prompt_tokens == prompt_tokens
    assert len(record.itl_s) == 3 and record.itl_s[1] == 0.0 and record.itl_s[0] > 0.01
    assert 0 < record.ttft_s < record.e2e_s
    assert (record.rid, record.finish_reason, record.worker) == ("rid1", "stop", "w0")
    assert check([record]) == []


async def test_chat_uses_usage_and_counts_chunks(chat_tok):
    def handler(request):
        body = json.loads(request.content)
        assert body["stream_options"] == {"include_usage": True} and body["model"] == "m"
        chunk = lambda delta, finish=None: {"id": "chatcmpl-abc", "choices": [  # noqa: E731
            {"index": 0, "delta": delta, "finish_reason": finish}], "usage": None}
        events = [chunk({"role": "assistant", "content": ""}), chunk({"content": "Hi"}),
                  chunk({"content": " you"}), chunk({}, "stop"),
                  {"id": "chatcmpl-abc", "choices": [], "usage": {
                      "prompt_tokens": 9, "completion_tokens": 3,
                      "prompt_tokens_details": {"cached_tokens": 4, "cached_tokens_details": {
                          "device": 1, "host": 1, "store": 2}}}}, "[DONE]"]
        return httpx.Response(200, content=_sse(events))

    http, client = _client(handler, "chat", chat_tok)
    record = Record("s", "r", "question")
    async with http:
        await client.send(MESSAGES, 8, record)
    assert record.ok, record.error
    assert (record.text, record.rid, record.finish_reason) == ("Hi you", "abc", "stop")
    assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens) == (9, 3, 4)
    assert (record.cached_host_tokens, record.cached_store_tokens) == (1, 2)
    assert not record.per_token_gaps and len(record.itl_s) == 1
    assert record.ttft_s > 0.03  # the role chunk is not the first token


@pytest.mark.parametrize("response, expected", [
    (lambda: httpx.Response(503, json={"error": {"message": "no worker"}}), "HTTP 503: no worker"),
    (lambda: httpx.Response(200, content=_sse([_native([5]), {"error": {"message": "boom"}}])),
     "stream error"),
    (lambda: httpx.Response(200, content=_sse([_native([5])])), "without [DONE]"),
])
async def test_failures_land_in_the_record(chat_tok, response, expected):
    http, client = _client(lambda request: response(), chat_tok=chat_tok)
    record = Record("s", "r", "question")
    async with http:
        await client.send(MESSAGES, 8, record)
    assert expected in record.error


async def test_connection_errors_do_not_raise(chat_tok):
    def handler(request):
        raise httpx.ConnectError("refused")

    http, client = _client(handler, chat_tok=chat_tok)
    record = Record("s", "r", "question")
    async with http:
        await client.send(MESSAGES, 8, record)
    assert record.error.startswith("ConnectError")
