"""The real `openai` client against the gateway: chat/completions, stream or not."""

from __future__ import annotations

import openai
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", timeout=300)


def test_models_list(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_non_stream_with_usage(client):
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0, max_tokens=30,
    )
    assert resp.choices[0].message.role == "assistant"
    assert "Paris" in resp.choices[0].message.content
    assert resp.usage.prompt_tokens > 5 and 0 < resp.usage.completion_tokens <= 30
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_chat_stream_concatenates_to_non_stream(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Name two fruits."}],
                  temperature=0, max_tokens=24)
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_completions_stream_and_not(client):
    kwargs = dict(model=MODEL, prompt="The quick brown fox", temperature=0, max_tokens=16)
    resp = client.completions.create(**kwargs)
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage.completion_tokens == 16 or resp.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True)
                       if c.choices)
    assert streamed == resp.choices[0].text


def test_seeded_sampling_is_reproducible(client):
    kwargs = dict(model=MODEL, prompt="My favourite animal is", max_tokens=16,
                  temperature=1.0, top_p=0.9, seed=1234)
    a = client.completions.create(**kwargs).choices[0].text
    b = client.completions.create(**kwargs).choices[0].text
    assert a == b


def test_stop_string_is_excluded(client):
    resp = client.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5,", max_tokens=30,
                                     temperature=0, stop=["8"])
    assert resp.choices[0].finish_reason == "stop"
    assert "8" not in resp.choices[0].text and "7" in resp.choices[0].text
