"""Streaming HTTP client: one request -> one filled :class:`Record`.

Two APIs of the gateway:

- ``generate`` (default): SGLang's native ``/generate`` with the chat template
  applied here (the server's own template, so the prompt text is what
  ``/v1/chat/completions`` would build) and tokenized by the server. Every
  event carries the cumulative ``output_ids``, so each output token gets its
  own arrival time: tokens that arrive in one event get gap 0.
- ``chat``: ``/v1/chat/completions`` with ``stream_options.include_usage``
  (works against any OpenAI-compatible server). A chunk may hold several
  tokens and tokens without text send no chunk, so gaps are per chunk.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx

from .record import Record
from .tokens import ChatTokenizer

APIS = ("generate", "chat")
# NOTE: the gateway names the worker that took a request in this header; /generate's
# last event says which one finished it (another after a move)
WORKER_HEADER = "x-radixmesh-worker"


@dataclass(frozen=True)
class ClientConfig:
    api: str = "generate"
    model: str = ""  # served model name (chat API)
    temperature: float = 0.0
    ignore_eos: bool = False
    seed: int = 0


class _Timer:
    """Arrival times of output tokens -> TTFT and gaps."""

    def __init__(self, record: Record) -> None:
        self.record = record
        self.t0 = time.perf_counter()
        self.last: float | None = None

    async def trace(self, event: str, info: dict) -> None:
        """httpx's trace extension: the clock starts when the request goes on the wire.

        NOTE: httpx spends milliseconds per request before that (building it, its
        connection pool); in a burst of 32 the last waited ~70 ms in the client,
        which is the harness's cost, not the server's.
        """
        if event == "http11.send_request_headers.started":
            self.t0 = time.perf_counter()

    def arrived(self, tokens: int) -> None:
        if tokens <= 0:
            return
        now = time.perf_counter()
        if self.last is None:
            self.record.ttft_s = now - self.t0
        else:
            self.record.itl_s.append(now - self.last)
        self.record.itl_s.extend([0.0] * (tokens - 1))
        self.last = now

    def done(self) -> None:
        self.record.e2e_s = time.perf_counter() - self.t0


class StreamClient:
    def __init__(self, http: httpx.AsyncClient, tok: ChatTokenizer, config: ClientConfig) -> None:
        if config.api not in APIS:
            raise ValueError(f"api must be one of {APIS}, got {config.api!r}")
        self.http = http
        self.tok = tok
        self.config = config

    async def send(self, messages: list[dict[str, str]], max_tokens: int, record: Record,
                   index: int = 0) -> None:
        """Run one request to its end; failures land in ``record.error``, never raise."""
        prompt = self.tok.prompt(messages)
        record.client_prompt_tokens = len(self.tok.text_ids(prompt))
        try:
            if self.config.api == "generate":
                await self._generate(prompt, max_tokens, record, index)
            else:
                await self._chat(messages, max_tokens, record, index)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"

    def _sampling(self, index: int) -> dict:
        body: dict = {"temperature": self.config.temperature}
        if self.config.temperature > 0:
            body["seed"] = self.config.seed * 100_003 + index
        if self.config.ignore_eos:
            body["ignore_eos"] = True
        return body

    async def _generate(self, prompt: str, max_tokens: int, record: Record, index: int) -> None:
        body = {"text": prompt, "stream": True,
                "sampling_params": {"max_new_tokens": max_tokens, **self._sampling(index)}}
        timer = _Timer(record)
        seen = 0
        event: dict = {}
        async for event in _events(self.http, "/generate", body, record, timer):
            ids = event["output_ids"]
            timer.arrived(len(ids) - seen)
            seen = len(ids)
        timer.done()
        if record.error is not None or not event:
            return
        meta = event["meta_info"]
        record.rid = meta.get("id")
        record.text = event["text"]
        record.stream_tokens = seen
        record.prompt_tokens = meta["prompt_tokens"]
        record.completion_tokens = meta["completion_tokens"]
        record.cached_tokens = meta.get("cached_tokens") or 0
        _tiers(record, meta.get("cached_tokens_details"))
        record.finish_reason = (meta.get("finish_reason") or {}).get("type")
        record.server_ttft_s = meta.get("ttft_s")
        record.worker = meta.get("worker") or record.worker

    async def _chat(self, messages: list[dict[str, str]], max_tokens: int, record: Record,
                    index: int) -> None:
        body = {"model": self.config.model, "messages": messages, "max_tokens": max_tokens,
                "stream": True, "stream_options": {"include_usage": True},
                **self._sampling(index)}
        record.per_token_gaps = False
        timer = _Timer(record)
        texts: list[str] = []
        usage: dict | None = None
        async for chunk in _events(self.http, "/v1/chat/completions", body, record, timer):
            record.rid = record.rid or str(chunk.get("id", "")).removeprefix("chatcmpl-")
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                timer.arrived(1 if text else 0)
                texts.append(text)
                record.finish_reason = choice.get("finish_reason") or record.finish_reason
        timer.done()
        record.text = "".join(texts)
        if record.error is None and usage is None:
            record.error = "stream ended without usage"
        if record.error is None:
            record.prompt_tokens = usage["prompt_tokens"]
            record.completion_tokens = usage["completion_tokens"]
            details = usage.get("prompt_tokens_details") or {}
            record.cached_tokens = details.get("cached_tokens") or 0
            record.cached_reported = details.get("cached_tokens") is not None
            _tiers(record, details.get("cached_tokens_details"))


def _tiers(record: Record, details: dict | None) -> None:
    """The server's split of the cached tokens (host, store; the rest on the device)."""
    record.cached_host_tokens = (details or {}).get("host") or 0
    record.cached_store_tokens = (details or {}).get("store") or 0


async def _events(http: httpx.AsyncClient, path: str, body: dict, record: Record,
                  timer: _Timer | None = None):
    """Yield the JSON events of one SSE response; errors go to ``record.error``."""
    extensions = {"trace": timer.trace} if timer is not None else None
    async with http.stream("POST", path, json=body, extensions=extensions) as resp:
        record.worker = resp.headers.get(WORKER_HEADER)
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            record.error = f"HTTP {resp.status_code}: {_message(text)}"
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            event = json.loads(data)
            if "error" in event:
                record.error = f"stream error: {_message(data)}"
                return
            yield event
    record.error = record.error or "stream ended without [DONE]"


def _message(text: str) -> str:
    try:
        return json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return text[:300]
