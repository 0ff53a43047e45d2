"""Streamed deltas concatenate exactly to the non-streamed text, emoji and CJK included."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = [
    "Reply with five emoji about the weather, nothing else.",
    "Translate 'good morning, friend' into Chinese and Japanese.",
    "Write the word café and naïve in a sentence.",
]


def sse_events(resp: httpx.Response) -> list[dict]:
    events = []
    for line in resp.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
    return events


@pytest.mark.parametrize("prompt", PROMPTS)
def test_stream_equals_non_stream(stack, prompt):
    body = {"model": "SmolLM2-135M-Instruct", "temperature": 0, "max_tokens": 40,
            "messages": [{"role": "user", "content": prompt}]}
    with httpx.Client(base_url=stack.url, timeout=300) as client:
        full = client.post("/v1/chat/completions", json=body).json()
        text = full["choices"][0]["message"]["content"]
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            events = sse_events(r)
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                       if e.get("choices"))
    assert streamed == text
    # NOTE: a length cut inside a multi-byte character legitimately ends in U+FFFD
    # (it is what tokenizer.decode gives); anywhere else it would be a split character.
    assert "\ufffd" not in text.rstrip("\ufffd")


def test_generate_stream_matches_output_ids(stack, hf_tokenizer):
    body = {"text": "Emoji test: 🎉🚀", "sampling_params": {"max_new_tokens": 24, "temperature": 0}}
    with httpx.Client(base_url=stack.url, timeout=300) as client:
        full = client.post("/generate", json=body).json()
        with client.stream("POST", "/generate", json={**body, "stream": True}) as r:
            events = sse_events(r)
    assert full["text"] == hf_tokenizer.decode(full["output_ids"], skip_special_tokens=True)
    assert events[-1]["text"] == full["text"]
    assert events[-1]["meta_info"]["completion_tokens"] == full["meta_info"]["completion_tokens"]
