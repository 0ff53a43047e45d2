"""What the pipeline submits: one request (:class:`GenerationRequest`), what a
resumed submission carries over (:class:`Resume`) and what a launch returns."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import msgspec

from libs.protocol.messages import ChatMessage, EncodeRequest, SamplingParams, TextDelta, ToolSpec

from .sampling import unresolved


@dataclass
class GenerationRequest:
    """One prompt (exactly one of text / messages / input_ids) and its sampling."""

    text: str | None = None
    messages: list[ChatMessage] | None = None
    input_ids: list[int] | None = None
    add_generation_prompt: bool = True
    max_new_tokens: int | None = None  # None: up to the context length
    # every sampling parameter (sampling.py); its max_new_tokens is resolved at submit
    params: SamplingParams = field(default_factory=unresolved)
    cache_salt: str = ""
    # how the response shows it: the prompt echoed first; logprobs in the body
    echo: bool = False
    show_logprobs: bool = False
    # chat tool calling: the functions offered; "auto": calls in the output are parsed,
    # "forced": the output is one call (``params.regex``); "": no tools
    tools: list[ToolSpec] = field(default_factory=list)
    tool_mode: str = ""

    def sampling(self, max_new_tokens: int) -> SamplingParams:
        return msgspec.structs.replace(self.params, max_new_tokens=max_new_tokens)


@dataclass(frozen=True)
class Resume:
    """What a submission carries over from earlier ones (none: a fresh request)."""

    seed: int | None = None
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    emitted_chars: int = 0

    def encode_request(self, fresh: EncodeRequest) -> EncodeRequest:
        """The fresh request's encode, or for a resume: its prompt ids (no re-tokenizing)
        and the output the new detok stream starts from."""
        if not self.prompt_ids:
            return fresh
        return msgspec.structs.replace(
            fresh, text=None, messages=None, input_ids=self.prompt_ids,
            output_ids=self.output_ids, emitted_chars=self.emitted_chars)


@dataclass
class Launched:
    queue: asyncio.Queue[TextDelta]
    prompt_ids: list[int]
    worker: str
    detok_instance: str
    session: str
