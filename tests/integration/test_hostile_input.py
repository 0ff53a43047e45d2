"""Hostile and malformed requests against a real stack: each gets a 4xx with an
OpenAI-style JSON error, and afterwards the stack is healthy and still serves.

The stack runs with API keys and every gateway limit switched on, on a NATS
broker that requires a user and password (every service gets them from env).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from libs.protocol import Bus
from libs.protocol.bus import BusAuthError
from libs.protocol.credentials import NatsCredentials
from radixmesh.launcher import LocalStack, ephemeral_stack_config
from radixmesh.natsd import NatsServer
from services.gateway.sse import parse_sse
from tests.integration.conftest import StackBus

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"
KEY = "hostile-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {"content-type": "application/json"}
CAP = 32
MAX_PROMPT = 512
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    logs = tmp_path_factory.mktemp("hostile-stack")
    keys = logs / "keys.txt"
    keys.write_text(f"{KEY} acme\n")
    gateway = ["--api-keys-file", str(keys), "--max-tokens-cap", str(CAP),
               "--max-prompt-tokens", str(MAX_PROMPT), "--max-concurrent-requests", "64",
               "--request-deadline", "120", "--max-body-bytes", str(1024 * 1024)]
    broker = NatsServer(user="radixmesh", password="bus-pass-123", log_file=logs / "nats.log")
    config = ephemeral_stack_config(logs, workers=1, extra={"gateway": gateway},
                                    nats_url=broker.url)
    with broker, pytest.MonkeyPatch.context() as env:
        for var, value in broker.client_credentials().env().items():
            env.setenv(var, value)  # the services inherit them
        with LocalStack(config, progress=lambda msg: None) as running:
            yield running


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": USER, **fields}


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "hi", **fields}


def raw(text: str) -> bytes:
    """``text`` with ``MODEL`` in place of ``{model}`` (other braces kept as they are)."""
    return text.replace("{model}", MODEL).encode()


# (name, method, path, body: dict | bytes | None, headers, expected status)
CASES = [
    # auth
    ("no api key", "POST", "/v1/chat/completions", chat(), {}, 401),
    ("wrong api key", "POST", "/v1/chat/completions", chat(), {"Authorization": "Bearer nope"}, 401),
    ("basic auth scheme", "POST", "/v1/completions", completion(), {"Authorization": "Basic eDp5"}, 401),
    ("key without scheme", "GET", "/v1/models", None, {"Authorization": KEY}, 401),
    # not JSON, or JSON of the wrong shape
    ("malformed json", "POST", "/v1/chat/completions", b"{not json", AUTH, 400),
    ("empty body", "POST", "/v1/completions", b"", AUTH, 400),
    ("json array body", "POST", "/v1/completions", b"[1, 2, 3]", AUTH, 400),
    ("json null body", "POST", "/generate", b"null", AUTH, 400),
    ("invalid utf-8", "POST", "/v1/completions",
     b'{"model": "' + MODEL.encode() + b'", "prompt": "\xff\xfe\xfd"}', AUTH, 400),
    ("lone surrogate", "POST", "/v1/completions",
     raw('{"model": "{model}", "prompt": "a\\ud800b"}'), AUTH, 400),
    ("deep json", "POST", "/v1/chat/completions", b"[" * 200_000 + b"]" * 200_000, AUTH, 400),
    ("deep json in prompt", "POST", "/v1/completions",
     raw('{"model": "{model}", "prompt": ' + "[" * 50_000 + "]" * 50_000 + '}'), AUTH, 400),
    ("deep json in content", "POST", "/v1/chat/completions",
     raw('{"model": "{model}", "messages": [{"role": "user", "content": '
         + "[" * 50_000 + "]" * 50_000 + '}]}'), AUTH, 400),
    ("10 MB body", "POST", "/v1/completions",
     raw('{"model": "{model}", "prompt": "' + "a" * 10_000_000 + '"}'), AUTH, 413),
    ("form content-type", "POST", "/v1/completions", b"model=x&prompt=y",
     {**AUTH, "content-type": "application/x-www-form-urlencoded"}, 400),
    ("NaN literal", "POST", "/v1/completions",
     raw('{"model": "{model}", "prompt": "a", "temperature": NaN}'), AUTH, 400),
    ("Infinity literal", "POST", "/v1/completions",
     raw('{"model": "{model}", "prompt": "a", "top_p": Infinity}'), AUTH, 400),
    ("overflowing float", "POST", "/v1/completions",
     raw('{"model": "{model}", "prompt": "a", "max_tokens": 1e400}'), AUTH, 400),
    # numbers out of range
    ("huge max_tokens", "POST", "/v1/completions", completion(max_tokens=10**30), AUTH, 400),
    ("max_tokens over the cap", "POST", "/v1/chat/completions", chat(max_tokens=CAP + 1), AUTH, 400),
    ("negative max_tokens", "POST", "/v1/chat/completions", chat(max_tokens=-1), AUTH, 400),
    ("negative max_new_tokens", "POST", "/generate",
     {"text": "a", "sampling_params": {"max_new_tokens": -7}}, AUTH, 400),
    ("negative temperature", "POST", "/v1/completions", completion(temperature=-1), AUTH, 400),
    ("huge temperature", "POST", "/v1/completions", completion(temperature=1e308), AUTH, 400),
    ("top_p zero", "POST", "/v1/completions", completion(top_p=0), AUTH, 400),
    ("negative top_k", "POST", "/v1/completions", completion(top_k=-5), AUTH, 400),
    ("huge top_k", "POST", "/v1/completions", completion(top_k=2**40), AUTH, 400),
    ("seed beyond 64 bits", "POST", "/v1/completions", completion(seed=2**70), AUTH, 400),
    ("n of 17", "POST", "/v1/chat/completions", chat(n=17), AUTH, 400),  # MAX_CHOICES is 16
    ("negative timeout", "POST", "/v1/chat/completions", chat(timeout=-1), AUTH, 400),
    ("zero timeout", "POST", "/generate", {"text": "a", "timeout": 0}, AUTH, 400),
    # wrong types
    ("messages as string", "POST", "/v1/chat/completions", chat(messages="hi"), AUTH, 400),
    ("prompt as object", "POST", "/v1/completions", completion(prompt={"a": 1}), AUTH, 400),
    ("stream as string", "POST", "/v1/chat/completions", chat(stream="yes"), AUTH, 400),
    ("max_tokens as string", "POST", "/v1/completions", completion(max_tokens="10"), AUTH, 400),
    ("model as number", "POST", "/v1/completions", completion(model=7), AUTH, 400),
    ("sampling_params as list", "POST", "/generate", {"text": "a", "sampling_params": [1]}, AUTH, 400),
    # bad content
    ("unknown field", "POST", "/v1/chat/completions", chat(hack=True), AUTH, 400),
    ("unknown nested field", "POST", "/v1/chat/completions",
     chat(messages=[{"role": "user", "content": "x", "evil": 1}]), AUTH, 400),
    ("bad role", "POST", "/v1/chat/completions",
     chat(messages=[{"role": "root", "content": "x"}]), AUTH, 400),
    ("tool role", "POST", "/v1/chat/completions",
     chat(messages=[{"role": "tool", "content": "x"}]), AUTH, 400),
    ("image content part", "POST", "/v1/chat/completions",
     chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), AUTH, 400),
    ("empty messages", "POST", "/v1/chat/completions", chat(messages=[]), AUTH, 400),
    ("unknown model", "POST", "/v1/chat/completions", chat(model="gpt-99"), AUTH, 404),
    ("token id out of range", "POST", "/v1/completions", completion(prompt=[1, 10**8]), AUTH, 400),
    ("token id beyond int32", "POST", "/generate", {"input_ids": [2**40]}, AUTH, 400),
    ("negative token id", "POST", "/generate", {"input_ids": [5, -1]}, AUTH, 400),
    ("empty input_ids", "POST", "/generate", {"input_ids": []}, AUTH, 400),
    ("text and input_ids", "POST", "/generate", {"text": "a", "input_ids": [1]}, AUTH, 400),
    ("prompt over the limit", "POST", "/v1/completions",
     completion(prompt=list(range(1, MAX_PROMPT + 2))), AUTH, 400),
    ("text prompt over the limit", "POST", "/v1/completions",
     completion(prompt="hello " * (MAX_PROMPT + 10), max_tokens=1), AUTH, 400),
    ("huge stop list", "POST", "/v1/completions", completion(stop=["x"] * 10_000), AUTH, 400),
    ("empty stop string", "POST", "/v1/completions", completion(stop=[""]), AUTH, 400),
    ("huge cache_salt", "POST", "/v1/completions", completion(cache_salt="s" * 10_000), AUTH, 400),
    ("stream_options without stream", "POST", "/v1/chat/completions",
     chat(stream_options={"include_usage": True}), AUTH, 400),
    # wrong method or path
    ("GET on a POST route", "GET", "/v1/chat/completions", None, AUTH, 405),
    ("unknown path", "POST", "/v1/engines/davinci/completions", completion(), AUTH, 404),
]


# the limit or check that must answer (error.code), where it is specific
CODES = {
    "no api key": "invalid_api_key", "wrong api key": "invalid_api_key",
    "10 MB body": "request_too_large", "max_tokens over the cap": "max_tokens_exceeded",
    "prompt over the limit": "prompt_too_long", "text prompt over the limit": "prompt_too_long",
    "unknown model": "model_not_found",
}


def test_the_table_is_big_enough():
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.fixture(scope="module")
def client(secured):
    with httpx.Client(base_url=secured.url, timeout=120) as client:
        yield client


@pytest.mark.parametrize("name,method,path,body,headers,status", CASES, ids=[c[0] for c in CASES])
def test_hostile_request_gets_a_clear_4xx(client, name, method, path, body, headers, status):
    if isinstance(body, bytes):
        resp = client.request(method, path, content=body, headers={**JSON, **headers})
    elif body is None:
        resp = client.request(method, path, headers=headers)
    else:
        resp = client.request(method, path, json=body, headers=headers)
    assert resp.status_code == status, resp.text[:500]
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error"
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == CODES.get(name, err["code"])


def test_chunked_10mb_body_without_length_gets_413(client):
    def chunks():
        yield b'{"model": "' + MODEL.encode() + b'", "prompt": "'
        for _ in range(100):
            yield b"a" * 100_000
        yield b'"}'

    resp = client.post("/v1/completions", content=chunks(), headers={**AUTH, **JSON})
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "request_too_large"


async def test_deadline_aborts_down_to_the_scheduler(secured):
    long = completion(prompt="Count from one to one hundred:", max_tokens=CAP, ignore_eos=True,
                      timeout=0.1)
    async with httpx.AsyncClient(base_url=secured.url, timeout=60) as client:
        resp = await client.post("/v1/completions", headers=AUTH, json=long)
        assert resp.status_code == 408, resp.text
        assert resp.json()["error"]["code"] == "timeout"
        resp = await client.post("/v1/completions", headers=AUTH, json={**long, "stream": True})
        events = parse_sse(resp.content)
        assert events[-2]["error"]["code"] == "timeout" and events[-1] == "[DONE]"
    bus = StackBus(secured)  # connects with the env credentials
    (worker,) = (await bus.workers()).workers
    for _ in range(50):
        stats = await bus.sched_stats(worker.worker_id)
        if stats.running == stats.waiting == 0:
            break
        await asyncio.sleep(0.1)
    assert stats.running == stats.waiting == 0  # both aborted, nothing left behind
    assert stats.free_slots + stats.evictable_slots == worker.total_slots


async def test_the_bus_refuses_clients_without_credentials(secured):
    with pytest.raises(BusAuthError, match="Authorization Violation"):
        await Bus.connect(secured.nats_url, "intruder", credentials=NatsCredentials())


def test_still_healthy_and_serving_after_the_table(secured, client):
    # runs after the table (file order): nothing above broke the stack
    secured.check_alive()
    assert client.get("/health").status_code == 200
    resp = client.post("/v1/chat/completions", headers=AUTH,
                       json=chat(max_tokens=4, temperature=0))
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] >= 1
    resp = client.post("/generate", headers=AUTH, json={"text": "Once upon a time",
                                                        "sampling_params": {"max_new_tokens": 3}})
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["output_ids"]) >= 1
