"""What the pipeline submits: one request (:class:`GenerationRequest`), what a
resumed submission carries over (:class:`Resume`) and what a launch returns."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import msgspec

from libs.protocol.messages import ChatMessage, EncodeRequest, SamplingParams, TextDelta, ToolSpec


@dataclass
class GenerationRequest:
    """One prompt (exactly one of text / messages / input_ids) and its sampling."""

    text: str | None = None
    messages: list[ChatMessage] | None = None
    input_ids: list[int] | None = None
    add_generation_prompt: bool = True
    max_new_tokens: int | None = None  # None: up to the context length
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    cache_salt: str = ""
    # logprobs of the output and of the prompt from logprob_start_len (-1: none)
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    # how the response shows it: the prompt echoed first; logprobs in the body
    echo: bool = False
    show_logprobs: bool = False
    regex: str = ""  # constrained decoding: the output fully matches it
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    # chat tool calling: the functions offered; "auto": calls in the output are parsed,
    # "forced": the output is one call (``regex``); "": no tools
    tools: list[ToolSpec] = field(default_factory=list)
    tool_mode: str = ""

    def sampling(self, max_new_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_new_tokens, temperature=self.temperature, top_p=self.top_p,
            top_k=self.top_k, seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos, skip_special_tokens=self.skip_special_tokens,
            return_logprob=self.return_logprob, logprob_start_len=self.logprob_start_len,
            top_logprobs_num=self.top_logprobs_num, regex=self.regex,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, min_p=self.min_p,
            min_tokens=self.min_tokens, logit_bias=self.logit_bias,
        )


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
