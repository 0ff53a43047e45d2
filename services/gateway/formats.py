"""Response bodies: OpenAI chat / text completions and SGLang's native /generate."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from libs.protocol.messages import TextDelta, Usage

from .generation import Completion


def usage_body(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


@dataclass
class OpenAIFormat:
    """Builds the bodies of one response; ``chat`` picks chat vs text completions."""

    rid: str
    model: str
    chat: bool
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.chat else "cmpl-") + self.rid

    def response(self, done: Completion) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": done.text},
                      "logprobs": None, "finish_reason": done.finish_reason}
        else:
            choice = {"index": 0, "text": done.text, "logprobs": None,
                      "finish_reason": done.finish_reason}
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice],
                "usage": usage_body(done.usage)}

    def chunk(self, text: str | None, finish_reason: str | None = None, role: bool = False) -> dict:
        """One streamed chunk; ``text`` None gives an empty delta (the finish chunk)."""
        if self.chat:
            delta: dict = {"role": "assistant", "content": text or ""} if role else (
                {} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        body = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, usage: Usage) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [],
                "usage": usage_body(usage)}


def native_body(rid: str, text: str, output_ids: list[int], finish_reason: str | None,
                usage: Usage) -> dict:
    """SGLang's /generate object; streams send it cumulatively."""
    return {
        "text": text,
        "output_ids": output_ids,
        "meta_info": {
            "id": rid,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens,
            "finish_reason": None if finish_reason is None else {"type": finish_reason},
        },
    }


def delta_usage(delta: TextDelta, prompt_tokens: int, completion_tokens: int) -> Usage:
    """Usage as known at this delta: the scheduler's on the last one, else counted."""
    return delta.usage or Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
