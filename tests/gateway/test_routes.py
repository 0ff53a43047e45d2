"""Request validation and error bodies: bad input never reaches the pipeline."""

from __future__ import annotations

import httpx
import pytest

from libs.protocol import errors
from services.gateway.app import create_app
from services.gateway.health import HealthReport
from services.gateway.pipeline import GenerationRequest
from services.gateway.routes import GatewaySettings

MODEL = "SmolLM2-135M-Instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": MODEL, "prompt": "hi"}


class RecordingBackend:
    """Records what passed validation and refuses it with a typed bus error."""

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []
        self.error = errors.overloaded("test backend refuses")

    async def submit(self, req: GenerationRequest):
        self.requests.append(req)
        raise self.error


async def _healthy() -> HealthReport:
    return HealthReport(True, {"status": "ok"})


@pytest.fixture()
def backend() -> RecordingBackend:
    return RecordingBackend()


def make_client(backend, **settings) -> httpx.AsyncClient:
    app = create_app(backend, GatewaySettings(MODEL, ("default",), **settings), _healthy)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


@pytest.fixture()
async def client(backend):
    async with make_client(backend) as client:
        yield client


def _error(resp: httpx.Response, status: int, param: str | None = "?", contains: str = "") -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if param != "?":
        assert err["param"] == param
    assert contains in err["message"]
    return err


BAD_CHAT = [
    ({"foo": 1}, "foo", "Unrecognized request argument supplied: foo"),
    ({"messages": [{"role": "user", "content": "x", "bar": 2}]}, "messages[0].bar", "Unrecognized"),
    ({"max_tokens": "a"}, "max_tokens", "Expected `int"),
    ({"max_tokens": -1}, "max_tokens", ">= 0"),
    ({"max_tokens": -5}, "max_tokens", ">= 0"),
    ({"max_completion_tokens": -1}, "max_completion_tokens", ">= 0"),
    ({"max_tokens": 1.5}, "max_tokens", ""),
    ({"temperature": "hot"}, "temperature", ""),
    ({"temperature": 2.5}, "temperature", "<= 2.0"),
    ({"top_p": 0}, "top_p", "> 0.0"),
    ({"top_k": -3}, "top_k", "-1"),
    ({"stream": "yes"}, "stream", "bool"),
    ({"messages": []}, "messages", "length >= 1"),
    ({"messages": "hi"}, "messages", "array"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "robot"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "required"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content", "not supported"),
    ({"stop": [str(i) for i in range(17)]}, "stop", "length <= 16"),
    ({"stop": [1]}, "stop[0]", ""),
    ({"stop": ""}, "stop", "empty"),
    ({"n": 17}, "n", "<= 16"),
    ({"n": 0}, "n", ">= 1"),
    ({"top_logprobs": 2}, "top_logprobs", "requires logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "<= 20"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "stream"),
    ({"stream": True, "stream_options": {"x": 1}}, "stream_options.x", "Unrecognized"),
    ({"seed": "1"}, "seed", ""),
    ({"user": 5}, "user", ""),
    ({"stop_token_ids": [-1]}, "stop_token_ids[0]", ""),
    ({"max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens", "differ"),
    ({"regex": ""}, "regex", "length >= 1"),
    ({"regex": "a" * 4097}, "regex", "length <= 4096"),
    ({"regex": "[0-9]+", "ignore_eos": True}, "regex", "ignore_eos"),
]


@pytest.mark.parametrize("patch,param,contains", BAD_CHAT)
async def test_bad_chat_requests_are_400(client, backend, patch, param, contains):
    resp = await client.post("/v1/chat/completions", json={**CHAT, **patch})
    err = _error(resp, 400, param, contains)
    assert err["type"] == "invalid_request_error"
    assert backend.requests == []


BAD_COMPLETION = [
    ({"prompt": [[1, 2]]}, "prompt[0]", ""),
    ({"prompt": ["a", "b"], "stream": True}, "prompt", "not supported"),
    ({"prompt": ["a"] * 65}, "prompt", "at most 64"),
    ({"prompt": []}, "prompt", "length >= 1"),
    ({"prompt": [1, "a"]}, "prompt", ""),
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": [-4]}, "prompt[0]", ">= 0"),
    ({"echo": True, "stream": True}, "echo", "not supported"),
    ({"logprobs": 6}, "logprobs", "<= 5"),
    ({"suffix": "z"}, "suffix", "not supported"),
    ({"messages": []}, "messages", "Unrecognized"),
]


@pytest.mark.parametrize("patch,param,contains", BAD_COMPLETION)
async def test_bad_completion_requests_are_400(client, backend, patch, param, contains):
    resp = await client.post("/v1/completions", json={**COMPLETION, **patch})
    _error(resp, 400, param, contains)
    assert backend.requests == []


BAD_GENERATE = [
    ({}, "text", "exactly one"),
    ({"text": "a", "input_ids": [1]}, "text", "exactly one"),
    ({"text": ""}, "text", "empty"),
    ({"input_ids": []}, "input_ids", "length >= 1"),
    ({"text": "a", "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens", ">= 0"),
    ({"text": "a", "sampling_params": {"foo": 1}}, "sampling_params.foo", "Unrecognized"),
    ({"text": "a", "sampling_params": {"top_k": 0.5}}, "sampling_params.top_k", ""),
    ({"text": "a", "sampling_params": {"top_k": -2}}, "sampling_params.top_k", ""),
    ({"text": "a", "model": "x"}, "model", "Unrecognized"),
    ({"text": "a", "sampling_params": {"regex": 5}}, "sampling_params.regex", "str"),
    ({"text": "a", "sampling_params": {"regex": "a+", "ignore_eos": True}},
     "sampling_params.regex", "ignore_eos"),
]


@pytest.mark.parametrize("body,param,contains", BAD_GENERATE)
async def test_bad_generate_requests_are_400(client, backend, body, param, contains):
    _error(await client.post("/generate", json=body), 400, param, contains)
    assert backend.requests == []


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/generate"])
@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"nope", b'{"model": "m",}'])
async def test_malformed_json_is_400(client, backend, path, raw):
    resp = await client.post(path, content=raw, headers={"content-type": "application/json"})
    _error(resp, 400)
    assert backend.requests == []


async def test_missing_model_and_unknown_model(client, backend):
    _error(await client.post("/v1/chat/completions", json={"messages": CHAT["messages"]}),
           400, "model", "model")
    err = _error(await client.post("/v1/completions", json={**COMPLETION, "model": "gpt-9"}), 404, "model")
    assert err["code"] == "model_not_found"
    assert backend.requests == []


async def test_body_size_limit_is_413(backend):
    async with make_client(backend, max_body_bytes=1000) as client:
        big = {**COMPLETION, "prompt": "x" * 2000}
        err = _error(await client.post("/v1/completions", json=big), 413)
        assert err["code"] == "request_too_large"

        async def chunks():  # no content-length: counted while reading
            for _ in range(5):
                yield b" " * 400

        _error(await client.post("/generate", content=chunks()), 413)
    assert backend.requests == []


async def test_bus_errors_map_by_status_and_code(client, backend):
    err = _error(await client.post("/v1/chat/completions", json=CHAT), 503)
    assert err["code"] == "overloaded"
    backend.error = errors.context_length_exceeded("prompt of 9000 tokens is too long")
    err = _error(await client.post("/v1/completions", json=COMPLETION), 400, contains="9000")
    assert err["code"] == "context_length_exceeded"
    backend.error = errors.timeout("slow")
    assert (await client.post("/generate", json={"text": "a", "stream": True})).status_code == 504


async def test_valid_requests_are_converted(client, backend):
    await client.post("/v1/chat/completions", json={
        **CHAT, "model": "default", "max_completion_tokens": 7, "temperature": 0, "top_k": 0,
        "seed": 5, "stop": "END", "n": 1, "logprobs": False, "presence_penalty": 0,
        "user": "u", "ignore_eos": True, "stop_token_ids": [2], "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "developer", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                     {"role": "assistant", "content": None}],
    })
    await client.post("/v1/completions", json={**COMPLETION, "prompt": [1, 2, 3]})
    await client.post("/v1/completions", json={**COMPLETION, "prompt": ["only"], "max_tokens": 3})
    await client.post("/generate", json={"input_ids": [4, 5], "sampling_params": {"temperature": 0.5}})
    await client.post("/v1/completions", json={**COMPLETION, "regex": "(yes|no)"})
    await client.post("/generate", json={"text": "q", "sampling_params": {"regex": "[0-9]{2}"}})
    chat, ids, text, native, regex, native_regex = backend.requests
    assert (regex.params.regex, native_regex.params.regex, chat.params.regex) == ("(yes|no)", "[0-9]{2}", "")
    assert regex.sampling(4).regex == "(yes|no)"
    assert [(m.role, m.content) for m in chat.messages] == [("system", "be brief"), ("user", "ab"), ("assistant", "")]
    assert (chat.max_new_tokens, chat.params.temperature, chat.params.top_k, chat.params.seed) == (7, 0.0, -1, 5)
    assert (chat.params.stop, chat.params.stop_token_ids, chat.params.ignore_eos) == (["END"], [2], True)
    assert chat.add_generation_prompt and chat.text is None
    assert (ids.input_ids, ids.max_new_tokens, ids.params.temperature) == ([1, 2, 3], 16, 1.0)
    assert (text.text, text.max_new_tokens) == ("only", 3)
    assert (native.input_ids, native.max_new_tokens, native.params.temperature) == ([4, 5], 128, 0.5)
    assert not native.add_generation_prompt


async def test_api_key(backend):
    async with make_client(backend, api_key="sekret") as client:
        err = _error(await client.post("/v1/chat/completions", json=CHAT), 401)
        assert err["code"] == "invalid_api_key"
        assert (await client.get("/v1/models")).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        _error(await client.post("/generate", json={"text": "a"}, headers=wrong), 401)
        ok = {"Authorization": "Bearer sekret"}
        assert (await client.get("/v1/models", headers=ok)).status_code == 200
        assert (await client.post("/generate", json={"text": "a"}, headers=ok)).status_code == 503
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/openapi.json")).status_code == 200
    assert len(backend.requests) == 1
