"""SGLang's utility endpoints against the real stack."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"


def test_health_generate_model_and_server_info(stack, model_dir):
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        health = client.get("/health_generate")
        assert health.status_code == 200, health.text
        assert health.json()["completion_tokens"] == 1 and health.json()["worker"]
        model = client.get("/get_model_info").json()
        assert model["is_generation"] is True
        assert model["model_path"] == model["tokenizer_path"] == str(model_dir)  # not "default"
        assert client.get("/get_server_info").json()["model_path"] == str(model_dir)
        info = client.get("/get_server_info").json()
        assert info["version"] == client.get("/version").json()["version"]
        assert info["served_model_name"] == MODEL and len(info["workers"]) >= 1


def _events(resp: httpx.Response):
    for line in resp.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def _abort_soon(url: str, rid: str, started: threading.Event, result: list) -> threading.Thread:
    def run():
        started.wait(60)
        result.append(httpx.post(f"{url}/abort_request", json={"rid": rid}, timeout=30))
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_abort_request_ends_a_native_stream_by_its_rid(stack):
    body = {"rid": "abort-me-1", "text": "Count to a thousand:", "stream": True,
            "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True, "temperature": 0}}
    started, result = threading.Event(), []
    thread = _abort_soon(stack.url, "abort-me-1", started, result)
    with httpx.stream("POST", f"{stack.url}/generate", json=body, timeout=300) as resp:
        events = []
        for event in _events(resp):
            events.append(event)
            started.set()
    thread.join()
    assert result[0].status_code == 200, result[0].text
    last = events[-1]["meta_info"]
    assert last["finish_reason"] == {"type": "abort"} and last["completion_tokens"] < 2000
    gone = httpx.post(f"{stack.url}/abort_request", json={"rid": "abort-me-1"}, timeout=30)
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "rid"


def test_abort_request_by_chat_completion_id(stack):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 2000, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=300) as resp:
        chunks = _events(resp)
        first = next(chunks)
        aborted = httpx.post(f"{stack.url}/abort_request", json={"rid": first["id"]}, timeout=30)
        rest = list(chunks)
    assert aborted.status_code == 200, aborted.text
    assert rest[-1]["choices"][0]["finish_reason"] == "abort"
