"""The gateway's HTTP API as the language needs it (httpx, async).

Text programs use /v1/completions, chat programs /v1/chat/completions. Every call
returns the generated text with its :class:`Usage` (``cached_tokens`` from
``usage.prompt_tokens_details``), which the states record per branch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import httpx


class LangError(RuntimeError):
    """A request of a program failed (HTTP status and the server's message)."""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def computed_tokens(self) -> int:
        """Prompt tokens the server had to compute (not served from its prefix cache)."""
        return self.prompt_tokens - self.cached_tokens

    @classmethod
    def from_body(cls, usage: dict) -> "Usage":
        details = usage.get("prompt_tokens_details") or {}
        return cls(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                   details.get("cached_tokens", 0) or 0)


@dataclass(frozen=True)
class Call:
    """One request a state made: what for ("gen", "select", "hold") and its usage."""

    kind: str
    usage: Usage


class Client:
    """One gateway: ``base_url`` (e.g. http://localhost:8000) and optional ``api_key``.

    ``model`` None: the first model /v1/models lists. ``transport`` is for tests.
    """

    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None,
                 timeout: float = 600.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout,
                                       transport=transport)
        self._model = model

    async def close(self) -> None:
        await self._http.aclose()

    async def model(self) -> str:
        if self._model is None:
            body = await self._post_or_get("GET", "/v1/models")
            self._model = body["data"][0]["id"]
        return self._model

    async def complete(self, prompt: str, **params) -> tuple[str, Usage]:
        """Continue ``prompt`` (params: max_tokens, stop, temperature, ...)."""
        body = await self._post("/v1/completions", {"prompt": prompt, **_clean(params)})
        return body["choices"][0]["text"], Usage.from_body(body["usage"])

    async def chat(self, messages: list[dict], **params) -> tuple[str, Usage]:
        """The assistant's next message after ``messages``."""
        body = await self._post("/v1/chat/completions", {"messages": messages, **_clean(params)})
        return body["choices"][0]["message"]["content"], Usage.from_body(body["usage"])

    async def hold(self, prompt: str | list[dict]) -> Usage:
        """Prefill only (max_tokens 0): the server computes and caches the prompt."""
        if isinstance(prompt, str):
            return (await self.complete(prompt, max_tokens=0))[1]
        return (await self.chat(prompt, max_tokens=0))[1]

    async def score(self, prefix: str, choices: Sequence[str]) -> tuple[list[list[float]], Usage]:
        """Logprobs of each choice's tokens after ``prefix``, in ONE request: the
        prompts ``prefix + choice`` echoed with their logprobs and max_tokens 0."""
        body = await self._post("/v1/completions", {
            "prompt": [prefix + c for c in choices], "max_tokens": 0, "echo": True,
            "logprobs": 0, "temperature": 0,
        })
        by_index = sorted(body["choices"], key=lambda c: c["index"])
        return ([choice_logprobs(c["logprobs"], len(ch)) for c, ch in zip(by_index, choices)],
                Usage.from_body(body["usage"]))

    async def _post(self, path: str, payload: dict) -> dict:
        payload = {"model": await self.model(), **payload}
        return await self._post_or_get("POST", path, payload)

    async def _post_or_get(self, method: str, path: str, payload: dict | None = None) -> dict:
        resp = await self._http.request(method, path, json=payload)
        if resp.status_code != 200:
            try:
                message = resp.json()["error"]["message"]
            except Exception:  # noqa: BLE001 - not an OpenAI error body
                message = resp.text[:500]
            raise LangError(f"{method} {path} failed with {resp.status_code}: {message}")
        return resp.json()


def choice_logprobs(logprobs: dict, choice_chars: int) -> list[float]:
    """Logprobs of the tokens that hold any of the last ``choice_chars`` characters
    of the echoed prompt (a token straddling the boundary counts for the choice).

    NOTE: counted from the end, so a prompt whose token texts do not add up to
    its characters (e.g. a byte-split character in the prefix) still splits right.
    """
    tokens = logprobs["tokens"]
    if not tokens:
        return []
    prefix_chars = logprobs["text_offset"][-1] + len(tokens[-1]) - choice_chars
    out = []
    for token, offset, value in zip(logprobs["tokens"], logprobs["text_offset"],
                                    logprobs["token_logprobs"]):
        if offset + len(token) > prefix_chars and value is not None:
            out.append(value)
    return out


def pick(scores: Sequence[Sequence[float]], normalize: bool = False) -> int:
    """Index of the likeliest choice: the largest sum of its tokens' logprobs, or with
    ``normalize`` the largest mean (favours long choices less); ties: the first."""
    def value(lps: Sequence[float]) -> float:
        if not lps:
            return -math.inf
        return sum(lps) / len(lps) if normalize else sum(lps)
    values = [value(s) for s in scores]
    return max(range(len(values)), key=lambda i: (values[i], -i))


def _clean(params: dict) -> dict:
    return {k: v for k, v in params.items() if v is not None}
