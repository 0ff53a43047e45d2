"""HTTP responses end to end through the pipeline, the test playing the other services."""

from __future__ import annotations

import httpx
import pytest

from libs.protocol import errors
from services.gateway.app import create_app
from services.gateway.health import BusHealth
from services.gateway.pipeline import PipelineConfig
from services.gateway.routes import GatewaySettings
from services.gateway.sse import parse_sse

MODEL = "served-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture()
async def client(pipeline, played):
    app = create_app(pipeline, GatewaySettings(MODEL), BusHealth(pipeline.bus, pipeline.subjects))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        yield client
    assert pipeline.open_requests == 0


async def test_chat_completion(client, played):
    resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert body["id"] == "chatcmpl-" + played.submits[0].rid
    assert isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "w0 w1 w2 w3 "}
    assert choice["finish_reason"] == "length" and choice["index"] == 0
    prompt = len(played.submits[0].input_ids)
    assert body["usage"] == {"prompt_tokens": prompt, "completion_tokens": 4,
                             "total_tokens": prompt + 4, "prompt_tokens_details": {
                                 "cached_tokens": 2, "cached_tokens_details": {"device": 2, "host": 0, "store": 0}}}


async def test_text_completion(client, played):
    resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": [5, 6, 7]})
    body = resp.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == "w0 w1 w2 w3 "
    assert body["usage"]["prompt_tokens"] == 3
    assert played.encodes[0].input_ids == [5, 6, 7]


async def test_generate(client, played):
    resp = await client.post("/generate", json={"text": "abc", "sampling_params": {"max_new_tokens": 4}})
    body = resp.json()
    assert body["text"] == "w0 w1 w2 w3 " and body["output_ids"] == [100, 101, 102, 103]
    meta = body["meta_info"]
    assert meta["id"] == played.submits[0].rid
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (3, 4, 2)
    assert meta["finish_reason"] == {"type": "length"}
    assert played.encodes[0].add_generation_prompt is False
    assert meta["worker"] == resp.headers["x-radixmesh-worker"] == "w1"


async def test_the_worker_is_named_in_headers_and_after_a_move(client, played):
    played.lost_workers, played.lost_after = {"w1"}, 2
    resp = await client.post("/generate", json={"input_ids": [1, 2], "stream": True})
    assert resp.headers["x-radixmesh-worker"] == "w1"  # the stream began there
    objs = parse_sse(resp.content)[:-1]
    assert objs[-1]["text"] == "w0 w1 w2 w3 " and objs[-1]["meta_info"]["worker"] == "w2"
    assert all("worker" not in o["meta_info"] for o in objs[:-1])
    chat = await client.post("/v1/chat/completions", json=CHAT)
    assert chat.headers["x-radixmesh-worker"] == "w2"  # non-stream: the worker that finished it


async def test_chat_stream_chunks(client, played):
    resp = await client.post("/v1/chat/completions",
                             json={**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.text.endswith("data: [DONE]\n\n")
    events = parse_sse(resp.content)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["id"] for c in chunks} == {"chatcmpl-" + played.submits[0].rid}
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    assert content == "w0 w1 w2 w3 "
    finish = chunks[-2]["choices"][0]
    assert finish["delta"] == {} and finish["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    assert all(c["usage"] is None for c in chunks[:-1])
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4


async def test_completion_stream_chunks(client, played):
    resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True})
    events = parse_sse(resp.content)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "w0 w1 w2 w3 "
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_generate_stream_is_cumulative(client, played):
    resp = await client.post("/generate", json={"input_ids": [1, 2], "stream": True})
    events = parse_sse(resp.content)
    assert events[-1] == "[DONE]"
    objs = events[:-1]
    texts = [o["text"] for o in objs]
    assert texts == sorted(texts, key=len) and texts[-1] == "w0 w1 w2 w3 "
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert objs[-1]["output_ids"] == [100, 101, 102, 103]
    assert objs[-1]["meta_info"]["finish_reason"] == {"type": "length"}
    assert all(o["meta_info"]["finish_reason"] is None for o in objs[:-1])


async def test_error_finish_non_stream_and_stream(client, played):
    played.mode = "error"
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 502
    assert resp.json()["error"]["code"] == "model_error"
    resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert resp.status_code == 200
    events = parse_sse(resp.content)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "model_error"
    assert events[-2]["error"]["message"] == "the worker died"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2]) == "a"
    resp = await client.post("/generate", json={"text": "x", "stream": True})
    assert parse_sse(resp.content)[-2]["error"]["code"] == "model_error"


async def test_stream_setup_errors_are_http_errors(client, played):
    played.encode_error = errors.context_length_exceeded("too long")
    resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "context_length_exceeded"


async def test_timeout_is_504_and_aborts(client, played, pipeline):
    played.mode = "hang"
    pipeline.config = PipelineConfig(request_timeout=0.2, bus_timeout=2.0)
    resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert resp.status_code == 504 and resp.json()["error"]["code"] == "timeout"
    resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True})
    assert parse_sse(resp.content)[-2]["error"]["code"] == "timeout"
    await played.wait_for(played.aborts, 2)
