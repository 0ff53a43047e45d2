"""Response bodies: OpenAI chat / text completions and SGLang's native /generate."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from typing import TYPE_CHECKING, Sequence

from libs.protocol.messages import TextDelta, Usage

from .generation import Completion
from .logprobs import chat_logprobs, legacy_logprobs, native_logprobs
from .sse import json_string, sse_event
from .tool_parser import parse_output
from .usage import cached_by_tier

if TYPE_CHECKING:
    from .pipeline import GenerationRequest


def usage_body(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens,
                                  "cached_tokens_details": cached_by_tier(usage)},
    }


@dataclass
class OpenAIFormat:
    """Builds the bodies of one response; ``chat`` picks chat vs text completions."""

    rid: str
    model: str
    chat: bool
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    # choice index -> the bytes of a text chunk's SSE event before and after its text
    _frames: dict[int, tuple[bytes, bytes]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.chat else "cmpl-") + self.rid

    def response(self, done: Completion, req: "GenerationRequest | None" = None) -> dict:
        """The body of one finished request (``req``: echo / logprobs as it asked)."""
        return self.batch_response([done], [req])

    def batch_response(self, dones: Sequence[Completion],
                       reqs: Sequence["GenerationRequest | None"], n: int = 1) -> dict:
        """One body for several prompts, ``n`` choices each (choice i answers prompt
        i // n); usage counts each prompt once and sums the completions."""
        choices = [self._choice(i, d, r) for i, (d, r) in enumerate(zip(dones, reqs))]
        usage = choices_usage([d.usage for d in dones], n)
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices,
                "usage": usage_body(usage)}

    def _choice(self, index: int, done: Completion, req: "GenerationRequest | None") -> dict:
        lp = getattr(done, "logprobs", None)
        shown = req is not None and req.show_logprobs and lp is not None
        if self.chat:
            message, finish = self._message(done, req)
            return {"index": index, "message": message,
                    "logprobs": chat_logprobs(lp) if shown else None, "finish_reason": finish}
        text, skip = done.text, 0
        if req is not None and req.echo:
            prompt = done.usage.prompt_tokens
            if req.text is not None:
                echoed = req.text
            elif lp is not None and lp.start == 0:
                echoed = "".join(lp.tokens[:prompt])
            else:
                echoed = ""
            text = echoed + text
        elif lp is not None:
            skip = max(0, done.usage.prompt_tokens - lp.start)  # only the completion's
        body = legacy_logprobs(lp, skip, req.params.top_logprobs_num > 0) if shown else None
        return {"index": index, "text": text, "logprobs": body, "finish_reason": done.finish_reason}

    @staticmethod
    def _message(done: Completion, req: "GenerationRequest | None") -> tuple[dict, str]:
        """The assistant message and finish reason; with tools, calls are parsed out."""
        if req is None or not req.tool_mode:
            return {"role": "assistant", "content": done.text}, done.finish_reason
        content, calls = parse_output(done.text)
        if not calls:
            return {"role": "assistant", "content": done.text}, done.finish_reason
        finish = "tool_calls" if done.finish_reason == "stop" else done.finish_reason
        return {"role": "assistant", "content": content,
                "tool_calls": [c.body() for c in calls]}, finish

    def chunk(self, text: str | None, finish_reason: str | None = None, role: bool = False,
              index: int = 0, delta: dict | None = None) -> dict:
        """One streamed chunk of choice ``index``; ``text`` None gives an empty delta
        (the finish chunk); ``delta`` (chat) a delta of its own (tool calls)."""
        if self.chat:
            if delta is None:
                delta = {"role": "assistant", "content": text or ""} if role else (
                    {} if text is None else {"content": text})
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        body = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        return body

    def text_event(self, text: str, index: int = 0) -> bytes:
        """``sse_event(self.chunk(text, index=index))``, byte for byte, without building the
        chunk: the bytes around the text are encoded once per choice, each event encodes
        its text alone."""
        frame = self._frames.get(index)
        if frame is None:
            whole = sse_event(self.chunk(_MARK, index=index))
            head, _, tail = whole.partition(json_string(_MARK))
            frame = self._frames[index] = (head, tail)
        return frame[0] + json_string(text) + frame[1]

    def usage_chunk(self, usage: Usage) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [],
                "usage": usage_body(usage)}


_MARK = "\x00radixmesh-text\x00"  # a text no chunk has: where the text goes in a frame


def choices_usage(usages: Sequence[Usage], n: int = 1) -> Usage:
    """Usage of ``n`` choices per prompt (in order): each prompt counted once (with its
    first choice's cached tokens), completions summed, as OpenAI counts them."""
    firsts = usages[::n]
    return Usage(prompt_tokens=sum(u.prompt_tokens for u in firsts),
                 completion_tokens=sum(u.completion_tokens for u in usages),
                 cached_tokens=sum(u.cached_tokens for u in firsts),
                 cached_host_tokens=sum(u.cached_host_tokens for u in firsts),
                 cached_store_tokens=sum(u.cached_store_tokens for u in firsts))


def native_body(rid: str, text: str, output_ids: list[int], finish_reason: str | None,
                usage: Usage, logprobs=None) -> dict:
    """SGLang's /generate object; streams send it cumulatively. ``logprobs`` (a
    Logprobs) adds SGLang's input/output_token_logprobs to meta_info."""
    body = {
        "text": text,
        "output_ids": output_ids,
        "meta_info": {
            "id": rid,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens,
            "cached_tokens_details": cached_by_tier(usage),
            "finish_reason": None if finish_reason is None else {"type": finish_reason},
        },
    }
    if logprobs is not None:
        body["meta_info"].update(native_logprobs(logprobs, usage.prompt_tokens))
    return body


def delta_usage(delta: TextDelta, prompt_tokens: int, completion_tokens: int) -> Usage:
    """Usage as known at this delta: the scheduler's on the last one, else counted."""
    return delta.usage or Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
