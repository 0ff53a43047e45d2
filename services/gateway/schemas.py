"""HTTP request bodies as msgspec Structs: decoding them is the type validation.

Unknown fields are rejected (OpenAI behaviour); semantic checks that need more
than one field live in :mod:`services.gateway.convert`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from libs.protocol.limits import MAX_TOP_LOGPROBS

MAX_STOP = 16
MAX_CHOICES = 16  # n: choices of one request

INT32_MAX = (1 << 31) - 1  # NOTE: every int reaches the bus: bounded so it always encodes
PositiveInt = Annotated[int, Meta(ge=1, le=INT32_MAX)]
TokenBudget = Annotated[int, Meta(ge=0, le=INT32_MAX)]  # 0: prefill only (the prompt gets cached)
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)]
TokenId = Annotated[int, Meta(ge=0, le=INT32_MAX)]
TopK = Annotated[int, Meta(ge=-1, le=INT32_MAX)]
Seed = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]  # int64
# seconds the whole request may take (submit to last token); past it: 504 / error event
Timeout = Annotated[float, Meta(gt=0.0, le=86400.0)]
Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
Stop = str | Annotated[list[str], Meta(max_length=MAX_STOP)]
# prefix-cache namespace: requests with different salts never share cached KV
CacheSalt = Annotated[str, Meta(max_length=256)]
RequestId = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
# constrained decoding (SGLang's ``regex``): the output fully matches it
Regex = Annotated[str, Meta(min_length=1, max_length=4096)]
# sampling controls (OpenAI's ranges; repetition as SGLang bounds it)
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=2.0)]
MinP = Annotated[float, Meta(ge=0.0, le=1.0)]
MAX_LOGIT_BIAS = 1024  # entries of one logit_bias map
LogitBias = Annotated[dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]], Meta(max_length=MAX_LOGIT_BIAS)]


class _Body(Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class StreamOptions(_Body, kw_only=True):
    include_usage: bool = False


class ContentPart(_Body, kw_only=True):
    type: str
    text: str | None = None


FunctionName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
MAX_TOOLS = 128


class FunctionCallBody(_Body, kw_only=True):
    name: FunctionName
    arguments: str  # a JSON object, as text (OpenAI)


class ToolCallBody(_Body, kw_only=True):
    id: Annotated[str, Meta(max_length=128)]
    type: Literal["function"] = "function"
    function: FunctionCallBody


class Message(_Body, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallBody] | None = None  # an assistant's calls
    tool_call_id: Annotated[str, Meta(max_length=128)] | None = None  # a tool message's call


class FunctionBody(_Body, kw_only=True):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema (none: no arguments)
    strict: bool | None = None


class ToolBody(_Body, kw_only=True):
    type: Literal["function"]
    function: FunctionBody


class NamedFunction(_Body, kw_only=True):
    name: FunctionName


class NamedToolChoice(_Body, kw_only=True):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Body, kw_only=True):
    name: Annotated[str, Meta(max_length=64)] = "response"
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseFormat(_Body, kw_only=True):
    """OpenAI structured outputs: free text, any JSON object, or JSON under a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class OpenAIRequestBase(_Body, kw_only=True):
    """Fields shared by chat and text completions."""

    model: str
    max_tokens: TokenBudget | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] | None = None
    user: str | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None  # token id (a string) -> bias added to its logit
    # extras (vLLM / SGLang)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stop_token_ids: list[TokenId] | None = None
    repetition_penalty: RepetitionPenalty | None = None
    min_p: MinP | None = None
    min_tokens: TokenBudget | None = None  # EOS and stop_token_ids held back until then
    cache_salt: CacheSalt | None = None
    timeout: Timeout | None = None
    regex: Regex | None = None
    response_format: ResponseFormat | None = None


class ChatCompletionRequest(OpenAIRequestBase, kw_only=True):
    messages: Annotated[list[Message], Meta(min_length=1)]
    tools: Annotated[list[ToolBody], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: TokenBudget | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None


class CompletionRequest(OpenAIRequestBase, kw_only=True):
    # str, [str] (a batch: one choice per prompt) or [token ids]
    prompt: str | Annotated[list[str | TokenId], Meta(min_length=1)]
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None  # OpenAI's limit
    echo: bool = False
    suffix: str | None = None


class SamplingParamsBody(_Body, kw_only=True):
    """``sampling_params`` of SGLang's native /generate."""

    max_new_tokens: TokenBudget | None = 128
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: TopK = -1
    seed: Seed | None = None
    stop: Stop | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    regex: Regex | None = None
    json_schema: str | dict[str, Any] | None = None  # SGLang: a JSON schema (as a string or object)
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    min_p: MinP = 0.0
    min_new_tokens: TokenBudget = 0
    logit_bias: LogitBias | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] = 1  # a list of n objects back (not streamed)


class GenerateRequest(_Body, kw_only=True):
    rid: RequestId | None = None  # SGLang: the client names the request (for /abort_request)
    text: str | None = None
    input_ids: Annotated[list[TokenId], Meta(min_length=1)] | None = None
    sampling_params: SamplingParamsBody = msgspec.field(default_factory=SamplingParamsBody)
    stream: bool = False
    # SGLang: logprobs of the output, and of the input from logprob_start_len (-1: none)
    return_logprob: bool = False
    logprob_start_len: Annotated[int, Meta(ge=-1, le=INT32_MAX)] = -1
    top_logprobs_num: TopLogprobs = 0
    cache_salt: CacheSalt | None = None
    timeout: Timeout | None = None


class AbortBody(_Body, kw_only=True):
    """POST /abort_request (SGLang)."""

    rid: RequestId


REQUEST_TYPES = (ChatCompletionRequest, CompletionRequest, GenerateRequest)
