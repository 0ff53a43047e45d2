"""HTTP request bodies as msgspec Structs: decoding them is the type validation.

Unknown fields are rejected (OpenAI behaviour); semantic checks that need more
than one field live in :mod:`services.gateway.convert`.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

MAX_STOP = 16

PositiveInt = Annotated[int, Meta(ge=1)]
TokenId = Annotated[int, Meta(ge=0)]
Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
Stop = str | Annotated[list[str], Meta(max_length=MAX_STOP)]
# prefix-cache namespace: requests with different salts never share cached KV
CacheSalt = Annotated[str, Meta(max_length=256)]


class _Body(Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class StreamOptions(_Body, kw_only=True):
    include_usage: bool = False


class ContentPart(_Body, kw_only=True):
    type: str
    text: str | None = None


class Message(_Body, kw_only=True):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class OpenAIRequestBase(_Body, kw_only=True):
    """Fields shared by chat and text completions."""

    model: str
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: Stop | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # extras (vLLM / SGLang)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stop_token_ids: list[TokenId] | None = None
    cache_salt: CacheSalt | None = None


class ChatCompletionRequest(OpenAIRequestBase, kw_only=True):
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionRequest(OpenAIRequestBase, kw_only=True):
    # str, [str] or [token ids]; a batch of several prompts is refused
    prompt: str | Annotated[list[str | TokenId], Meta(min_length=1)]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None


class SamplingParamsBody(_Body, kw_only=True):
    """``sampling_params`` of SGLang's native /generate."""

    max_new_tokens: PositiveInt | None = 128
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: Stop | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True


class GenerateRequest(_Body, kw_only=True):
    text: str | None = None
    input_ids: Annotated[list[TokenId], Meta(min_length=1)] | None = None
    sampling_params: SamplingParamsBody = msgspec.field(default_factory=SamplingParamsBody)
    stream: bool = False
    cache_salt: CacheSalt | None = None


REQUEST_TYPES = (ChatCompletionRequest, CompletionRequest, GenerateRequest)
