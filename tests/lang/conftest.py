"""A scripted gateway on httpx.MockTransport: records every request body it gets."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from radixmesh.lang import Runtime


class Gateway:
    """Answers like the gateway: completions continue with ``<n>`` (n = prompt
    length), chats with ``reply<k>``; echoed prompts score each character as one
    token whose logprob is -1, or -0.1 for a vowel. Tracks requests in flight."""

    def __init__(self, delay: float = 0.02) -> None:
        self.bodies: list[tuple[str, dict]] = []
        self.delay = delay
        self.inflight = 0
        self.max_inflight = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        body = json.loads(request.content)
        self.bodies.append((request.url.path, body))
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.inflight -= 1
        if body.get("max_tokens") == -1:
            return httpx.Response(400, json={"error": {"message": "bad max_tokens"}})
        if request.url.path == "/v1/chat/completions":
            text = "" if body["max_tokens"] == 0 else f"reply{len(body['messages'])}"
            return httpx.Response(200, json={"choices": [{"index": 0, "message": {"content": text}}],
                                             "usage": _usage(len(body["messages"]) * 10)})
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        choices = []
        for i, p in enumerate(prompts):
            text = "" if body["max_tokens"] == 0 else f"<{len(p)}>"
            lp = None
            if body.get("echo"):
                lp = {"tokens": list(p), "text_offset": list(range(len(p))),
                      "token_logprobs": [None] + [-0.1 if c in "aeiou" else -1.0 for c in p[1:]]}
                text = p + text
            choices.append({"index": i, "text": text, "logprobs": lp})
        return httpx.Response(200, json={"choices": choices[::-1],  # order by index, not position
                                          "usage": _usage(sum(map(len, prompts)))})


def _usage(prompt: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": prompt // 2}}


@pytest.fixture
def gateway() -> Gateway:
    return Gateway()


@pytest.fixture
def runtime(gateway):
    with Runtime("http://gw", api_key="k", transport=httpx.MockTransport(gateway)) as rt:
        yield rt
